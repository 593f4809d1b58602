"""The token store under real kills (its builder, and a biphasic run trained from it), FineWeb-Edu's layout built by two
processes, and a branch at the switch (issue 13's done-when)."""
import json
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import torch

from mlmclm.core import project_root, read_json, read_jsonl
from mlmclm.data import build_store, embedded_documents, load_tokenizer, write_hub_layout
from mlmclm.model import load

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


BIPHASIC = ['size=tiny', 'schedule=biphasic', 'clm_steps=6', 'total_steps=12', 'seq_len=32', 'batch_size=4',
            'warmup_steps=1', 'decay_steps=2', 'save_every=1', 'log_every=1', 'progress=False', 'prefetch=0',
            'checkpoint_steps=6']


def _pretrain(tmp_path, **kw):
    "In this process: one start of python is what a run costs most on a busy CPU."
    from mlmclm.core import build_config
    from mlmclm.pretrain import PretrainConfig, pretrain
    values = dict(a.split('=', 1) for a in BIPHASIC)
    values = {k: (int(v) if v.isdigit() else {'False': False}.get(v, v)) for k, v in values.items()}
    return pretrain(build_config(PretrainConfig, {**values, 'out_dir': str(tmp_path), 'store_dir': str(tmp_path/'stores'), **kw}))


def _losses(run):
    return [(m['step'], m['loss']) for m in read_jsonl(run/'metrics.jsonl')]


def test_a_biphasic_run_from_the_store_equals_a_killed_and_resumed_one_and_a_branch_at_the_switch(tmp_path, capsys):
    straight = _pretrain(tmp_path, run_id='straight')
    record = read_json(straight/'run.json')
    assert record['data']['first_token'] == 0 and record['data']['end_token'] == 12 * 4 * 32
    assert Path(record['data']['store']).parent == tmp_path/'stores'          # the embedded corpus, built into a store
    kill_after = random.Random().randint(2, 10)                                # a random step (printed, to reproduce)
    print(f'killing after step {kill_after}')
    cmd = [sys.executable, '-m', 'mlmclm.pretrain', 'run', *BIPHASIC, f'out_dir={tmp_path}',
           f'store_dir={tmp_path/"stores"}', 'run_id=killed']
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    metrics, deadline = tmp_path/'killed'/'metrics.jsonl', time.time() + 300
    while time.time() < deadline and proc.poll() is None and len(read_jsonl(metrics)) < kill_after:
        time.sleep(0.005)
    proc.send_signal(signal.SIGKILL); proc.wait()
    assert len(read_jsonl(metrics)) < 12, 'the run ended before the kill'
    capsys.readouterr()
    killed = _pretrain(tmp_path, run_id='killed')
    assert 'resumed from' in capsys.readouterr().out
    branch = _pretrain(tmp_path, run_id='branch', resume_from=str(straight/'checkpoints'/'step-6'))
    assert _losses(killed) == _losses(straight), f'killed after step {kill_after}'   # step for step, exactly
    assert _losses(branch) == _losses(straight)[6:]
    final = load(straight/'checkpoints'/'step-12').state_dict()
    for other in (killed, branch):
        again = load(other/'checkpoints'/'step-12').state_dict()
        assert all(torch.equal(final[k], again[k]) for k in final), (other, kill_after)


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


def test_a_run_that_passes_the_end_of_its_store_warns_with_the_epoch_count(tmp_path):
    import pytest
    from mlmclm.core import build_config
    from mlmclm.pretrain import PretrainConfig, pretrain
    (tmp_path/'small.txt').write_text('A short text that a long run reads more than once. ' * 12)
    cfg = build_config(PretrainConfig, size='tiny', total_steps=6, seq_len=32, batch_size=4, warmup_steps=1,
                       decay_steps=2, progress=False, prefetch=0, data=str(tmp_path/'small.txt'),
                       out_dir=str(tmp_path), run_id='r', store_dir=str(tmp_path/'stores'))
    with pytest.warns(RuntimeWarning, match=r'REPEATS DATA, \d+\.\d\d epochs'):
        run = pretrain(cfg)
    data = read_json(run/'run.json')['data']
    assert data['repeats'] and data['epochs'] == round(6 * 4 * 32 / data['store_tokens'], 4) > 1
