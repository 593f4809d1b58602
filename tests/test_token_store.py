"""The token store's builder under a real kill, and FineWeb-Edu's layout built by two processes (issue 13)."""
import json
import signal
import subprocess
import sys
import time

from mlmclm.core import project_root, read_json
from mlmclm.data import build_store, embedded_documents, load_tokenizer, write_hub_layout

ROOT = project_root()


def _shas(folder):
    return [s['sha256'] for s in read_json(folder/'manifest.json')['shards']]


def test_a_build_killed_with_sigkill_resumes_to_the_same_bytes(tmp_path):
    straight = build_store('embedded', tmp_path/'straight', shard_tokens=40_000)
    cmd = [sys.executable, '-m', 'mlmclm.data', 'build-store', '--out', str(tmp_path/'killed'), '--shard-tokens', '40000']
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    manifest, deadline = tmp_path/'killed'/'manifest.json', time.time() + 120
    def shards():
        try: return len(json.loads(manifest.read_text())['shards'])
        except (OSError, ValueError): return 0
    while time.time() < deadline and shards() < 4 and proc.poll() is None:
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL); proc.wait()
    killed = read_json(manifest)
    assert not killed['complete'] and 4 <= len(killed['shards']) < 32, (killed['complete'], len(killed['shards']))
    again = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr[-2000:]
    assert _shas(tmp_path/'killed') == _shas(straight)
    assert read_json(tmp_path/'killed'/'manifest.json')['n_tokens'] == read_json(straight/'manifest.json')['n_tokens']


def test_a_fake_fineweb_edu_stream_builds_with_two_workers_to_the_bytes_of_one(tmp_path):
    repo = write_hub_layout(tmp_path/'HuggingFaceFW'/'fineweb-edu', embedded_documents('train')[:900], files=3,
                            row_group_size=50)
    tok = load_tokenizer()
    one = build_store('fineweb-edu', tmp_path/'one', tok, repo=str(repo), subset='sample-10BT', shard_tokens=50_000)
    two = build_store('fineweb-edu', tmp_path/'two', tok, repo=str(repo), subset='sample-10BT', shard_tokens=50_000,
                      workers=2)
    m = read_json(two/'manifest.json')
    assert m['complete'] and m['units'] == 18 and m['n_documents'] == 900, (m['units'], m['n_documents'])
    assert m['builds'][-1]['workers'] == 2
    assert _shas(one) == _shas(two)
    print(f"fake FineWeb-Edu: {m['tokens_per_document']:.0f} tokens per document (embedded tokenizer)")
