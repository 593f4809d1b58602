"""The token store (`mlmclm.data.token_store`) under real kills (its builder, and a biphasic run trained from it),
FineWeb-Edu's layout built by two processes, and a branch at the switch (issue 13's done-when); a manifest that
disagrees with its shards, a saved tokenizer that disagrees with its manifest, and `--max-tokens` values that are not a
whole number of tokens are refused."""
import json
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import torch

import mlmclm.data.sources as data
import mlmclm.data.token_store as token_store
from mlmclm.base.files import project_root, read_json, read_jsonl
from mlmclm.data.corpus import embedded_documents
from mlmclm.data.tokenizers import load_tokenizer
from mlmclm.data.token_store import build_store
from fake_hub import write_hub_layout
from mlmclm.model.checkpoints import load

ROOT = project_root()


def _shas(folder):
    return [s['sha256'] for s in read_json(folder/'manifest.json')['shards']]


def test_a_build_killed_with_sigkill_resumes_to_the_same_bytes(tmp_path):
    straight = build_store('embedded', tmp_path/'straight', shard_tokens=40_000)
    cmd = [sys.executable, '-m', 'mlmclm.data.token_store', 'build-store', '--out', str(tmp_path/'killed'), '--shard-tokens', '40000']
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
    from mlmclm.base.configs import build_config
    from mlmclm.protocol.runs import PretrainConfig
    from mlmclm.pretraining.loop import pretrain
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
    cmd = [sys.executable, '-m', 'mlmclm.pretraining.loop', 'run', *BIPHASIC, f'out_dir={tmp_path}',
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
    from mlmclm.base.configs import build_config
    from mlmclm.protocol.runs import PretrainConfig
    from mlmclm.pretraining.loop import pretrain
    (tmp_path/'small.txt').write_text('A short text that a long run reads more than once. ' * 12)
    cfg = build_config(PretrainConfig, size='tiny', total_steps=6, seq_len=32, batch_size=4, warmup_steps=1,
                       decay_steps=2, progress=False, prefetch=0, data=str(tmp_path/'small.txt'),
                       out_dir=str(tmp_path), run_id='r', store_dir=str(tmp_path/'stores'))
    with pytest.warns(RuntimeWarning, match=r'REPEATS DATA, \d+\.\d\d epochs'):
        run = pretrain(cfg)
    data = read_json(run/'run.json')['data']
    assert data['repeats'] and data['epochs'] == round(6 * 4 * 32 / data['store_tokens'], 4) > 1


# ---------------------------------------------------------------- issue 27, items 13, 14 and 20: the manifest is checked
import shutil

import pytest

from mlmclm.base.files import atomic_write_json
from mlmclm.data.sources import StoreError
from mlmclm.data.token_store import TokenStore, main as data_main

SHARD = 40_000


@pytest.fixture(scope='module')
def small_store(tmp_path_factory):
    "The embedded corpus in 32 shards of 40,000 tokens (built once; each test edits a copy)."
    return build_store('embedded', tmp_path_factory.mktemp('store')/'emb', shard_tokens=SHARD)


def _copy(store, tmp_path, edit=None):
    "A copy of `store` whose manifest `edit(m)` changed (in place)."
    out = tmp_path/'copy'
    shutil.copytree(store, out)
    if edit:
        m = read_json(out/'manifest.json'); edit(m); atomic_write_json(out/'manifest.json', m)
    return out


def _set(key, value): return lambda m: m.update({key: value(m) if callable(value) else value})
def _shard0(key, value): return lambda m: m['shards'][0].update({key: value})


EDITED_MANIFESTS = {   # id: (the edit, what the refusal says)
    'n_tokens lowered': (_set('n_tokens', lambda m: m['n_tokens'] - 1000), 'n_tokens='),
    'n_tokens raised': (_set('n_tokens', lambda m: m['n_tokens'] + 1000), 'n_tokens='),
    'shard_tokens raised': (_set('shard_tokens', 2 * SHARD), f'shard_tokens={2 * SHARD}'),
    'shard_tokens lowered': (_set('shard_tokens', SHARD // 2), f'shard_tokens={SHARD // 2}'),
    "a shard's tokens changed": (_shard0('tokens', SHARD - 7), f'shard-000000.tokens.npy holds {SHARD:,} tokens'),
    "a shard's documents changed": (_shard0('documents', 1), 'shard-000000.starts.npy holds'),
    'n_documents changed': (_set('n_documents', 3), 'n_documents=3'),
}


@pytest.mark.parametrize('case', list(EDITED_MANIFESTS))
def test_item13_a_manifest_that_disagrees_with_its_shards_is_refused_when_the_store_is_opened(small_store, tmp_path, case):
    edit, message = EDITED_MANIFESTS[case]
    folder = _copy(small_store, tmp_path, edit)
    with pytest.raises(StoreError) as err:
        TokenStore(folder)
    assert message in str(err.value) and str(folder/'manifest.json') in str(err.value), str(err.value)
    assert 'build-store' in str(err.value)                     # and what to do


def test_item13_a_truncated_shard_file_is_refused_when_the_store_is_opened_not_when_read(small_store, tmp_path):
    folder = _copy(small_store, tmp_path)
    path = folder/'shard-000003.tokens.npy'
    path.write_bytes(path.read_bytes()[:-100])
    with pytest.raises(StoreError, match=r'shard-000003.tokens.npy is \d+ bytes, \d+ expected'):
        TokenStore(folder, verify=False)


def test_item13_the_builder_repairs_an_edited_n_tokens_and_an_edited_shard_entry(small_store, tmp_path):
    folder = _copy(small_store, tmp_path, lambda m: (m.update(n_tokens=5), m['shards'][4].update(tokens=1)))
    build_store('embedded', folder, shard_tokens=SHARD)       # the same command that built it repairs it
    assert _shas(folder) == _shas(small_store)
    assert len(TokenStore(folder)) == read_json(small_store/'manifest.json')['n_tokens']


def test_item14_max_tokens_given_on_resume_is_honoured_or_refused(small_store, tmp_path):
    "What a kill leaves of a build capped at 1M: 3 shards and the cursor; resumed with other caps."
    def killed(m):
        m.update(complete=False, max_tokens=1_000_000, shards=m['shards'][:3], cursor=m['shards'][3]['begins_at'])
        del m['n_tokens']
    folder = _copy(small_store, tmp_path, killed)
    with pytest.raises(StoreError, match=r'already holds 120,000 tokens, more than max_tokens=100,000'):
        build_store('embedded', folder, shard_tokens=SHARD, max_tokens=100_000)
    build_store('embedded', folder, shard_tokens=SHARD, max_tokens=200_000)
    m = read_json(folder/'manifest.json')
    assert (m['n_tokens'], m['max_tokens'], m['complete']) == (200_000, 200_000, True)
    assert _shas(folder) == _shas(small_store)[:5]            # the first 200,000 tokens of the same stream


TORN_MANIFESTS = {   # id: (bytes of manifest.json from the good one, what the error says)
    'truncated': (lambda b: b[:len(b) // 2], 'is not JSON'),
    'garbage': (lambda b: b'\x00\xff garbage', 'is not JSON'),
    'empty': (lambda b: b'', 'is not JSON'),
    'a list': (lambda b: b'[1, 2]', 'not a token-store manifest'),
    'no shards': (lambda b: json.dumps({k: v for k, v in json.loads(b).items() if k != 'shards'}).encode(),
                  "has no 'shards'"),
    'a shard without checksums': (lambda b: json.dumps(dict(json.loads(b), shards=[
        {k: v for k, v in s.items() if k != 'sha256'} for s in json.loads(b)['shards']])).encode(), "shards[0] has no 'sha256'"),
    'n_tokens a string': (lambda b: json.dumps(dict(json.loads(b), n_tokens='many')).encode(), "'n_tokens' is 'many'"),
}


@pytest.mark.parametrize('case', list(TORN_MANIFESTS))
def test_item20_a_torn_or_corrupt_manifest_is_named_by_the_reader_the_builder_and_verify_store(small_store, tmp_path, case,
                                                                                             capsys):
    damage, message = TORN_MANIFESTS[case]
    folder = _copy(small_store, tmp_path)
    path = folder/'manifest.json'
    path.write_bytes(damage(path.read_bytes()))
    for attempt in (lambda: TokenStore(folder), lambda: build_store('embedded', folder, shard_tokens=SHARD)):
        with pytest.raises(StoreError) as err:
            attempt()
        assert str(path) in str(err.value) and message in str(err.value), str(err.value)
    with pytest.raises(SystemExit) as err:
        data_main(['verify-store', str(folder)])
    assert str(path) in str(err.value.code) and message in str(err.value.code), err.value.code


@pytest.mark.slow
def test_item14_a_build_killed_under_one_cap_and_resumed_under_a_smaller_one_stops_there_or_refuses(tmp_path):
    "A real SIGKILL at a random point of a build capped at 1M tokens, resumed with --max-tokens 200000."
    cmd = [sys.executable, '-m', 'mlmclm.data.token_store', 'build-store', '--out', str(tmp_path/'s'), '--shard-tokens', str(SHARD)]
    proc = subprocess.Popen([*cmd, '--max-tokens', '1000000'], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    target, deadline = random.Random().randint(1, 8), time.time() + 120     # shards written before the kill
    def shards():
        try: return len(json.loads((tmp_path/'s'/'manifest.json').read_text())['shards'])
        except (OSError, ValueError): return 0
    while time.time() < deadline and shards() < target and proc.poll() is None:
        time.sleep(0.005)
    proc.send_signal(signal.SIGKILL); proc.wait()
    written = sum(s['tokens'] for s in read_json(tmp_path/'s'/'manifest.json')['shards'])
    again = subprocess.run([*cmd, '--max-tokens', '200000'], cwd=ROOT, capture_output=True, text=True, timeout=300)
    print(f'killed after {written:,} tokens (target {target} shards)')
    if written > 200_000:
        assert again.returncode != 0 and f'already holds {written:,} tokens' in again.stderr, again.stderr[-2000:]
    else:
        assert again.returncode == 0, again.stderr[-2000:]
        assert read_json(tmp_path/'s'/'manifest.json')['n_tokens'] == 200_000


# ---------------------------------------------------------------- clear errors (issue 34 item 10: N25)
@pytest.mark.parametrize('value', ['1e400', '-1e400', 'inf', 'nan', '0', '2.5', 'abc'])
def test_build_store_max_tokens_out_of_range_is_a_usage_error(value, capsys):
    with pytest.raises(SystemExit) as e: token_store.main(['build-store', f'--max-tokens={value}'])
    assert e.value.code == 2
    assert f"argument --max-tokens: {value!r} is not a whole number of tokens >= 1" in capsys.readouterr().err


def test_build_store_max_tokens_accepts_floats_that_are_whole():
    args = token_store._cli().parse_args(['build-store', '--max-tokens', '1.3e11'])
    assert args.max_tokens == 130_000_000_000 and type(args.max_tokens) is int


# ------------------------------------- a store's saved tokenizer is checked against its manifest (issue 34 item 6: N12)
def _swap_the_and(folder):
    "N12's edit: the ids of 'Ġthe' and 'Ġand' swapped in the saved tokenizer.json."
    p = folder/'tokenizer'/'tokenizer.json'
    t = json.loads(p.read_text()); v = t['model']['vocab']
    v['Ġthe'], v['Ġand'] = v['Ġand'], v['Ġthe']
    p.write_text(json.dumps(t))
    return p


@pytest.fixture
def store(tmp_path):
    return token_store.build_store('embedded', tmp_path/'st', shard_tokens=20_000, max_tokens=60_000)


def test_the_manifest_records_each_tokenizer_file(store):
    files = read_json(store/'manifest.json')['tokenizer']['files']
    assert files == token_store.tokenizer_files(store/'tokenizer') and 'tokenizer.json' in files


def test_a_swapped_tokenizer_is_refused_at_open_on_growth_and_by_verify(store, capsys):
    edited = _swap_the_and(store)
    want = f'{edited} differs from the manifest'
    with pytest.raises(token_store.StoreError, match=want): token_store.TokenStore(store)
    with pytest.raises(token_store.StoreError, match=want): token_store.open_store(store, data.load_tokenizer('embedded'))
    shards = read_json(store/'manifest.json')['shards']
    with pytest.raises(token_store.StoreError, match=want):
        token_store.build_store('embedded', store, shard_tokens=20_000, max_tokens=120_000)   # N12: grown with "and" for "the"
    assert read_json(store/'manifest.json')['shards'] == shards   # nothing written
    assert token_store.verify_store(store) == 1 and want in capsys.readouterr().out


def test_an_extra_or_missing_tokenizer_file_is_named(store):
    (store/'tokenizer'/'added_tokens.json').write_text('{"the": 5}')
    with pytest.raises(token_store.StoreError, match=r'tokenizer/added_tokens.json is not in the manifest'): token_store.TokenStore(store)
    (store/'tokenizer'/'added_tokens.json').unlink(); (store/'tokenizer'/'tokenizer_config.json').unlink()
    with pytest.raises(token_store.StoreError, match=r'tokenizer/tokenizer_config.json is missing'): token_store.TokenStore(store)


def test_an_older_manifest_stays_readable_and_is_checked_by_definition(store):
    m = read_json(store/'manifest.json'); del m['tokenizer']['files']; atomic_write_json(store/'manifest.json', m)
    assert len(token_store.TokenStore(store)) == 60_000                           # readable: the definition matches
    token_store.build_store('embedded', store, shard_tokens=20_000, max_tokens=80_000)   # growing records the files from now on
    assert read_json(store/'manifest.json')['tokenizer']['files'] == token_store.tokenizer_files(store/'tokenizer')
    m = read_json(store/'manifest.json'); del m['tokenizer']['files']; atomic_write_json(store/'manifest.json', m)
    _swap_the_and(store)
    with pytest.raises(token_store.StoreError, match=r"tokenizer defines another tokenizer .* than the manifest's"):
        token_store.TokenStore(store)
