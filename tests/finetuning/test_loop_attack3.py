"""Issue 33 items 1, 11, 13 and issue 34 items 6, 9, 10, 11 on the fine-tuning and data side: a GPU's token budget
from the model, its precision and its state; a loop that does not wait on the host; datasets loaded at a pinned
revision and recorded; a token store's tokenizer checked against its manifest; feature-cache entries that cannot be
read are misses; clear errors for `--max-tokens 1e400` and a damaged `<store>.examples.npz`; a per-user cache."""
from types import SimpleNamespace

import pytest
import torch

import mlmclm.finetuning.loop as ft

import mlmclm.finetuning.sweep as sw
from mlmclm.protocol.runs import FinetuneConfig, shard_dir
import mlmclm.finetuning.features as enc
import mlmclm.finetuning.evaluation as ev
from mlmclm.base.configs import ConfigError
from mlmclm.model.sizes import GIB, model_config

GPU = torch.device('cuda')   # never used to compute: only its type is read, and the card's memory is mocked


@pytest.fixture
def card(monkeypatch):
    "Pretend the GPU has `gib` GiB of memory."
    def set_card(gib):
        monkeypatch.setattr(torch.cuda, 'get_device_properties', lambda d: SimpleNamespace(total_memory=int(gib * GIB)))
    return set_card


def _estimate(size, precision, tokens, backend='sdpa'):
    m = ft.finetune_memory(model_config(size), precision, backend)
    return m['state'] + tokens * m['per_token']


# ---- issue 33 item 1: the GPU budget fits the model ------------------------------------------------------------
def test_1b_fp32_budget_fits_an_80gb_card_where_the_per_gib_rule_did_not(card):
    card(79.1)
    usable = 79.1 * (1 - ft.MEMORY_MARGIN)
    # the fixed 256 tokens per GiB overflowed the card: about 94 GiB for the 28-layer shape issue 33 measured (now
    # '1.2b'), 79 GiB for the authors' 26-layer 1b, against 67 usable
    assert _estimate('1.2b', 'fp32', 19_456) > 90 and _estimate('1b', 'fp32', 19_456) > usable
    tokens = ft.token_budget(GPU, 2028, model_config('1b'), 'fp32', 'sdpa')
    assert 2028 <= tokens < 19_456 and tokens % 1024 == 0
    assert _estimate('1b', 'fp32', tokens) <= usable < _estimate('1b', 'fp32', tokens + 1024)


def test_budget_follows_size_and_precision(card):
    card(79.1)
    b = {(s, p): ft.token_budget(GPU, 2028, model_config(s), p, 'sdpa')
         for s in ('210m', '610m', '1b') for p in ('pure_bf16', 'amp_bf16', 'fp32')}
    for p in ('pure_bf16', 'amp_bf16', 'fp32'): assert b['210m', p] > b['610m', p] > b['1b', p]
    for s in ('210m', '610m', '1b'): assert b[s, 'pure_bf16'] > b[s, 'amp_bf16'] > b[s, 'fp32']


def test_budget_reads_the_sizes_tables_by_name(card, monkeypatch):
    "A re-measured activation table changes the budget: nothing is copied."
    card(79.1)
    before = ft.token_budget(GPU, 2028, model_config('610m'), 'pure_bf16', 'flash')
    monkeypatch.setattr(ft, 'stored_activation_bytes', lambda cfg, bf16, checkpointed=False, compiled=False: 2 * 72032.0)
    after = ft.token_budget(GPU, 2028, model_config('610m'), 'pure_bf16', 'flash')
    assert after < 0.6 * before


def test_a_card_too_small_for_one_input_is_refused_with_the_numbers(card):
    card(16)
    with pytest.raises(ConfigError) as e: ft.token_budget(GPU, 2028, model_config('1b'), 'fp32', 'sdpa')
    msg = str(e.value)
    for part in ("precision='fp32'", 'max_length=2028', '0.98B-parameter', 'GiB usable', '16.0 GiB less 15%'):
        assert part in msg, (part, msg)


def test_cpu_budget_is_unchanged():
    assert ft.token_budget(torch.device('cpu'), 128) == 1024
    assert ft.token_budget(torch.device('cpu'), 2028, model_config('1b'), 'fp32') == 2028


def test_an_unmeasured_shape_is_measured(card):
    card(79.1)
    odd = model_config('tiny', hidden_size=96, num_attention_heads=3, num_key_value_heads=3, head_dim=32)
    assert ft.token_budget(GPU, 512, odd, 'fp32', 'sdpa') > 100_000


# ---- issue 34 item 9 (N14, N16): cache entries that cannot be used are logged misses ----------------------------
import hashlib
import io
import json
import os
import warnings
import zipfile

import numpy as np

KEY = dict(what='sequence', n=1)
FEATS = [dict(input_ids=[1, 2, 3], label=1)]


def _entry(folder):
    enc.cached_features(folder, KEY, lambda: FEATS)
    return next(folder.glob('sequence-*.features'))


def _signed(key, n, layout, payload: bytes) -> bytes:
    "A cache file with a valid checksum around `payload` (an npz), as a co-writer could plant it."
    body = json.dumps(dict(key=key, n=n, layout=layout), sort_keys=True).encode() + b'\n' + payload
    return enc.FEATURES_MAGIC + hashlib.sha256(body).hexdigest().encode() + b'\n' + body


def _rebuilt(folder, contains):
    calls = []
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter('always')
        got = enc.cached_features(folder, KEY, lambda: calls.append(1) or FEATS)
    assert got == FEATS and calls == [1]
    msgs = [str(w.message) for w in seen]
    assert any(contains in m for m in msgs), msgs
    return msgs


@pytest.fixture
def no_allocation(monkeypatch):
    "np.load in the cache is an allocation: the planted files below must be refused before it."
    def refuse(*a, **k): raise AssertionError('np.load reached: the arrays would be allocated')
    monkeypatch.setattr(enc.np, 'load', refuse)


def test_a_compressed_bomb_with_a_valid_checksum_is_a_miss_before_any_allocation(tmp_path, no_allocation):
    entry = _entry(tmp_path)
    buf = io.BytesIO(); np.savez_compressed(buf, c0=np.zeros(2**31, np.int8)[:2**24])   # 2**24 stands in for 2**31
    entry.write_bytes(_signed(KEY, 1, [['input_ids', 'ints', 'c0']], buf.getvalue()))
    _rebuilt(tmp_path, f"{entry} holds a compressed member 'c0.npy'; it was removed and is rebuilt")


def test_a_header_promising_more_than_the_member_holds_is_a_miss(tmp_path, no_allocation):
    entry = _entry(tmp_path)
    npy = io.BytesIO(); np.lib.format.write_array_header_1_0(npy, dict(descr='|i1', fortran_order=False, shape=(2**31,)))
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, 'w', zipfile.ZIP_STORED) as z: z.writestr('c0.npy', npy.getvalue() + b'\0' * 16)
    entry.write_bytes(_signed(KEY, 1, [['input_ids', 'ints', 'c0']], buf.getvalue()))
    _rebuilt(tmp_path, "whose header ((2147483648,), int8) does not match")


def test_memory_error_while_reading_is_a_miss(tmp_path, monkeypatch):
    _entry(tmp_path)
    def oom(*a, **k): raise MemoryError('Unable to allocate 2.00 GiB')
    monkeypatch.setattr(enc, '_unpack', oom)
    _rebuilt(tmp_path, 'cannot be read (MemoryError: Unable to allocate 2.00 GiB); it was removed and is rebuilt')


def test_a_folder_in_place_of_a_cache_file_is_named_and_the_sweep_goes_on(tmp_path):
    entry = _entry(tmp_path); entry.unlink(); entry.mkdir(); (entry/'x').write_text('kept')
    for _ in range(2):   # every rerun too
        _rebuilt(tmp_path, f'{entry} is not a regular file; it is a folder, left as it is; the features are not cached')
    assert (entry/'x').read_text() == 'kept'


def test_a_fifo_in_place_of_a_cache_file_does_not_hang(tmp_path):
    entry = _entry(tmp_path); entry.unlink(); os.mkfifo(entry)
    _rebuilt(tmp_path, f'{entry} is not a regular file; it was removed and is rebuilt')
    assert entry.is_file() and enc.cached_features(tmp_path, KEY, lambda: 1 / 0) == FEATS


def test_an_oversized_file_is_not_read(tmp_path, monkeypatch):
    entry = _entry(tmp_path)
    monkeypatch.setattr(enc, 'MAX_FEATURES_BYTES', 100)
    monkeypatch.setattr(enc._read_regular, '__defaults__', (100,))
    _rebuilt(tmp_path, f'{entry} holds {entry.stat().st_size:,} bytes, more than the 100 a cache file may')


# ---- issue 34 item 11: the default feature cache is this user's -------------------------------------------------
def test_the_default_cache_is_a_per_user_folder(tmp_path, monkeypatch):
    monkeypatch.delenv('MLMCLM_FEATURE_CACHE', raising=False)
    cfg = FinetuneConfig(results=str(tmp_path/'r.jsonl'))
    assert enc.feature_cache_dir(cfg) == tmp_path/'features'/f'uid-{os.getuid()}'
    assert enc.feature_cache_dir(FinetuneConfig(results=str(tmp_path/'r.jsonl'), feature_cache=str(tmp_path/'shared'))) \
        == tmp_path/'shared'   # a folder given explicitly: as given


def test_a_default_cache_folder_others_can_write_is_not_used(tmp_path, monkeypatch):
    monkeypatch.delenv('MLMCLM_FEATURE_CACHE', raising=False)
    folder = tmp_path/'features'/f'uid-{os.getuid()}'; folder.mkdir(parents=True); folder.chmod(0o775)
    with pytest.warns(RuntimeWarning, match='is writable by its group or others .mode 775.'):
        assert enc.feature_cache_dir(FinetuneConfig(results=str(tmp_path/'r.jsonl'))) is None
    folder.chmod(0o755)
    assert enc.feature_cache_dir(FinetuneConfig(results=str(tmp_path/'r.jsonl'))) == folder


# ---- issue 34 item 10 (N25, N26): clear errors ------------------------------------------------------------------
import mlmclm.data.sources as data
import mlmclm.data.token_store as token_store
import mlmclm.results.store as res


@pytest.mark.parametrize('value', ['1e400', '-1e400', 'inf', 'nan', '0', '2.5', 'abc'])
def test_build_store_max_tokens_out_of_range_is_a_usage_error(value, capsys):
    with pytest.raises(SystemExit) as e: token_store.main(['build-store', f'--max-tokens={value}'])
    assert e.value.code == 2
    assert f"argument --max-tokens: {value!r} is not a whole number of tokens >= 1" in capsys.readouterr().err


def test_build_store_max_tokens_accepts_floats_that_are_whole():
    args = token_store._cli().parse_args(['build-store', '--max-tokens', '1.3e11'])
    assert args.max_tokens == 130_000_000_000 and type(args.max_tokens) is int


ROW = dict(checkpoint_name='m', dataset='sst2', family='SC', lr=1e-4, seed=0, val_score=.5, test_score=.5)


@pytest.mark.parametrize('damage', ['object array', 'not an npz', 'truncated'])
def test_a_damaged_legacy_examples_file_is_named_with_what_to_do(tmp_path, damage):
    store = tmp_path/'results.jsonl'
    with res.StoreWriter(store) as w: w.append([ROW])
    legacy = tmp_path/'results.jsonl.examples.npz'
    if damage == 'object array': np.savez(legacy, k=np.array([{'a': 1}], dtype=object))
    elif damage == 'not an npz': legacy.write_bytes(b'\x80\x04garbage')
    else:
        np.savez(legacy, k=np.arange(100)); legacy.write_bytes(legacy.read_bytes()[:60])
    with pytest.raises(ConfigError) as e: res.read_examples(store)
    msg = str(e.value)
    assert str(legacy) in msg and 'Restore it from a copy, or move it away' in msg and "force='why'" in msg


def test_a_sound_legacy_examples_file_is_still_read(tmp_path):
    store = tmp_path/'results.jsonl'
    with res.StoreWriter(store) as w: w.append([ROW])
    key = next(iter(res.current_rows(res.read_rows(store))))
    np.savez(tmp_path/'results.jsonl.examples.npz', **{key: np.array([1.0, 0.0])})
    assert res.read_examples(store)[key].tolist() == [1.0, 0.0]


# ---- issue 34 item 6 (N12): a store's saved tokenizer is checked against its manifest ---------------------------
from mlmclm.base.files import read_json, atomic_write_json


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


# ---- issue 33 item 13: datasets at a pinned revision, the revision loaded recorded ------------------------------
import dataclasses

import mlmclm.tasks.registry as tasks
from mlmclm.results.store import load_results


@pytest.fixture
def local_sc(tmp_path, monkeypatch):
    "A sentiment dataset in the hub's layout in a local folder (as `datasets` reads a repo), registered as a task."
    import datasets
    monkeypatch.setattr(datasets.config, 'HF_DATASETS_CACHE', str(tmp_path/'hf-cache'))
    root = tmp_path/'local_sc'; (root/'data').mkdir(parents=True)
    for split, n in (('train', 16), ('validation', 4), ('test', 4)):
        datasets.Dataset.from_dict(dict(sentence=[f'film {i} was {"good" if i % 2 else "bad"}' for i in range(n)],
                                        label=[i % 2 for i in range(n)])).to_parquet(root/'data'/f'{split}-00000-of-00001.parquet')
    def load_():
        return {s: [dict(text=r['sentence'], label=r['label']) for r in tasks._hub(str(root), None, s)]
                for s in ('train', 'validation', 'test')}
    monkeypatch.setitem(tasks.TASKS, 'local_sc', tasks.Task('local_sc', 'SC', 'sequence', load_, ('bad', 'good'), max_length=64))
    return root


def _sweep(results, task):
    sw.finetune_sweep(FinetuneConfig(tasks=task, lrs='1e-3', seeds='0', max_steps=1, eval_every=1, batch_size=4,
                                               micro_batch_size=4, max_eval_examples=4, results=str(results),
                                               feature_cache='off', progress=False))
    return results


def test_a_local_dataset_is_recorded_by_its_content_in_rows_and_the_config(tmp_path, local_sc):
    data, rev = tasks.load_task_revision(tasks.TASKS['local_sc'])
    assert rev.startswith('content-sha256:') and len(data['train']) == 16
    store = _sweep(tmp_path/'r.jsonl', 'local_sc')
    rows = load_results(store)
    assert rows['dataset_revision'].tolist() == [rev]
    record = next((shard_dir(store)/'configs').glob('*/run.json'))
    assert json.loads(record.read_text())['dataset_revisions'] == {'local_sc': rev}
    (local_sc/'data'/'test-00000-of-00001.parquet').write_bytes(
        (local_sc/'data'/'train-00000-of-00001.parquet').read_bytes())   # the data moved
    assert tasks.load_task_revision(tasks.TASKS['local_sc'])[1] not in (None, rev)


def test_embedded_rows_say_no_revision_is_known(tmp_path):
    rows = load_results(_sweep(tmp_path/'r.jsonl', 'rt_sentiment'))
    assert 'dataset_revision' in rows and rows['dataset_revision'].isna().all()


COMMIT, OTHER = 'a' * 40, 'b' * 40


@pytest.fixture
def hub_calls(monkeypatch, tmp_path):
    "`datasets.load_dataset` as the hub answers: the data cached in a folder named by the commit loaded."
    import datasets
    calls = []
    def load_dataset(path, name=None, split=None, revision=None):
        calls.append(dict(path=path, name=name, split=split, revision=revision))
        commit = revision if revision and len(revision) == 40 else COMMIT
        return SimpleNamespace(cache_files=[dict(filename=str(tmp_path/'cache'/path/'default'/'0.0.0'/commit/'x.arrow'))])
    monkeypatch.setattr(datasets, 'load_dataset', load_dataset)
    return calls


def _hub_task(revisions=()):
    def load_():
        tasks._hub('org/a', None, 'train'); tasks._hub('org/a', None, 'test')
        return dict(train=[], validation=[], test=[])
    return tasks.Task('pinned', 'SC', 'sequence', load_, revisions=revisions)


def test_a_pinned_revision_is_passed_to_load_dataset_and_recorded(hub_calls):
    assert tasks.load_task_revision(_hub_task())[1] == COMMIT                   # unpinned: the commit the hub gave
    assert [c['revision'] for c in hub_calls] == [None, None]
    hub_calls.clear()
    assert tasks.load_task_revision(_hub_task((('org/a', OTHER),)))[1] == OTHER
    assert [c['revision'] for c in hub_calls] == [OTHER, OTHER]


def test_a_task_reading_two_repos_records_both(hub_calls):
    def load_():
        tasks._hub('org/corpus', 'corpus', 'corpus'); tasks._hub('org/qrels', None, 'test')
        return dict(train=[], validation=[], test=[])
    task = tasks.Task('two', 'IR', 'embedding', load_, revisions=(('org/qrels', OTHER),))
    assert tasks.load_task_revision(task)[1] == f'org/corpus@{COMMIT};org/qrels@{OTHER}'


def test_the_rows_revision_names_the_training_task_when_it_trains_on_another():
    data = dict(msmarco=dict(revision='r1'), msmarco_pairs=dict(revision='r2'), rt_sentiment={})
    T = tasks.TASKS
    assert ft.dataset_revision(data, T['msmarco_pairs'], T['msmarco']) == 'r1;train msmarco_pairs=r2'
    assert ft.dataset_revision(data, T['msmarco_pairs'], T['msmarco_pairs']) == 'r2'
    assert ft.dataset_revision(data, T['rt_sentiment'], T['rt_sentiment']) is None


# ---- issue 33 item 11: the training loop does not wait on the device ---------------------------------------------
from mlmclm.model.transformer import HostSyncs
from mlmclm.finetuning.batches import collate_packed
from mlmclm.tasks.registry import TASKS


@pytest.fixture(scope='module')
def tiny():
    base, tok = ft._load_base(FinetuneConfig())
    return base, tok, {'rt_sentiment': TASKS['rt_sentiment'].load()}


def _train_syncs(tiny, steps, monkeypatch=None, **options):
    base, tok, data = tiny
    task = TASKS['rt_sentiment']
    cfg = FinetuneConfig(**{**dict(max_steps=steps, batch_size=8, micro_batch_size=4, micro_batch_tokens=160, device='cpu',
                                      feature_cache='off', eval_every=50), **options})
    run = ft._run_context(task, tok, cfg)
    kind = ev.KINDS['sequence']
    model = ft.run_model(base, kind, task, run)
    feats = kind.features(data['rt_sentiment']['train'], run)
    opt, sched = ft.optimizer(model, 1e-3, steps, 1, run.device)
    if monkeypatch:   # the loop alone: the CPU's own waits (AdamW's step count, the reference attention) left out
        monkeypatch.setattr(ft, 'batch_backward', lambda *a, **k: torch.ones(()) * sched.last_epoch)
        monkeypatch.setattr(ft, 'optimizer_step', lambda model, opt, sched: (opt.step(), sched.step()))
    losses = []
    with HostSyncs() as syncs:
        ft._train(model, kind, feats, steps, opt, sched, 0, run, [task], data, losses)
    return syncs, losses


def test_training_steps_read_their_losses_in_bulk_not_each_step(tiny, monkeypatch):
    "Before: `loss.item()` after every step, a host wait per step; now one read per `eval_every` steps and at the end."
    syncs, losses = _train_syncs(tiny, 12, monkeypatch)
    assert losses == [float(s) for s in range(12)]
    assert syncs.count == 0, dict(syncs.ops)   # before: 12 (`.item()`); the bulk reads (`.cpu().tolist()`) wait once each on a GPU


def test_a_diverged_step_is_still_named_with_its_learning_rate(tiny, monkeypatch):
    real = ft.batch_backward
    calls = []
    def nan_at_3(*a, **k):
        calls.append(1)
        out = real(*a, **k)
        return out * float('nan') if len(calls) == 3 else out
    monkeypatch.setattr(ft, 'batch_backward', nan_at_3)
    with pytest.raises(FloatingPointError, match=r'fine-tuning loss is nan at step 3 of 12 \(learning rate '):
        _train_syncs(tiny, 12, eval_every=4)
    assert len(calls) == 4   # found at the first read after it (step 4), not at the end


def test_staged_batches_are_the_collated_batches_one_ahead():
    from mlmclm.finetuning.batches import staged
    feats = [dict(input_ids=list(range(3, 3 + n)), label=n % 2) for n in (5, 9, 3, 7, 4)]
    made = []
    def batches():
        for i in range(0, 5, 2):
            made.append(i); yield collate_packed(feats[i:i + 2], 0)
    got = []
    for b in staged(batches(), 'cpu'):
        got.append((len(made), b)) 
    assert [n for n, _ in got] == [2, 3, 3]   # when batch k is handed out, batch k + 1 is already collated
    for (_, b), i in zip(got, range(0, 5, 2)):
        want = collate_packed(feats[i:i + 2], 0)
        assert b.keys() == want.keys() and all(torch.equal(b[k], want[k]) if torch.is_tensor(want[k]) else b[k] == want[k]
                                               for k in want)
    assert list(staged(iter([]), 'cpu')) == []


def test_blocks_are_compiled_only_where_asked_or_on_cuda(tiny, monkeypatch):
    base, tok, _ = tiny
    task, kind = TASKS['rt_sentiment'], ev.KINDS['sequence']
    compiled = []
    monkeypatch.setattr(ft, 'compile_blocks', lambda model, **kw: compiled.append(model) or model)
    for option, device, want in ((None, 'cpu', False), (True, 'cpu', True), (False, 'cpu', False)):
        run = ft._run_context(task, tok, FinetuneConfig(compile=option, device=device, feature_cache='off'))
        ft.run_model(base, kind, task, run)
        assert (len(compiled) == 1) == want, (option, device); compiled.clear()
    run = ft._run_context(task, tok, FinetuneConfig(device='cpu', feature_cache='off'))
    assert ft.compiled(dataclasses.replace(run, device=torch.device('cuda'))) is True


def test_the_default_cache_folder_is_made_for_this_user_alone_whatever_the_umask(tmp_path, monkeypatch):
    monkeypatch.delenv('MLMCLM_FEATURE_CACHE', raising=False)
    old = os.umask(0o002)   # a group-sharing umask, common on clusters
    try: folder = enc.feature_cache_dir(FinetuneConfig(results=str(tmp_path/'r.jsonl')), create=True)
    finally: os.umask(old)
    assert folder == tmp_path/'features'/f'uid-{os.getuid()}' and (folder.stat().st_mode & 0o777) == 0o700
    with warnings.catch_warnings():
        warnings.simplefilter('error')   # used again without a warning
        assert enc.feature_cache_dir(FinetuneConfig(results=str(tmp_path/'r.jsonl')), create=True) == folder


def test_a_pinned_commit_that_is_not_the_one_loaded_is_an_error(monkeypatch, tmp_path):
    import datasets
    monkeypatch.setattr(datasets, 'load_dataset', lambda path, name=None, split=None, revision=None: SimpleNamespace(
        cache_files=[dict(filename=str(tmp_path/path/'default'/'0.0.0'/COMMIT/'x.arrow'))]))
    with pytest.raises(ConfigError, match=f'org/a was pinned to revision {OTHER} but {COMMIT} was loaded'):
        tasks.load_task_revision(_hub_task((('org/a', OTHER),)))
