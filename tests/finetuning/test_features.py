"""The fine-tuning feature cache (`mlmclm.finetuning.features`) under attack (issue 27 items 5, 8, 9): a planted pickle,
labels changed outside any sample, flipped bytes; the format's exact round trip of every head kind's features; entries
that cannot be used (a compressed bomb, a lying header, a folder or a FIFO in their place, an oversized file) are logged
misses (issue 34 item 9); the default cache is this user's alone (issue 34 item 11)."""
import dataclasses
import hashlib
import io
import json
import os
import pickle
import random
import warnings
import zipfile

import numpy as np
import pytest
import torch

import mlmclm.finetuning.loop as ft
from mlmclm.protocol.runs import FinetuneConfig
import mlmclm.finetuning.features as enc
import mlmclm.finetuning.evaluation as ev
from mlmclm.tasks.registry import TASKS

CASES = {   # id: (task, the KINDS row, options)
    'SC': ('rt_sentiment', 'sequence', {}),
    'TC encodeval': ('tweet_ner', 'token', {}),
    'TC seqeval': ('tweet_ner', 'first_token', {}),
    'QA tokens': ('corpus_cloze', 'answer_tokens', {}),
    'QA spans': ('corpus_cloze', 'span', dict(qa_mode='squad')),
    'IR pairs': ('corpus_retrieval', 'embedding', {}),
}


@pytest.fixture(scope='module')
def tok():
    return ft.load_tokenizer('embedded')


def _run(tok, folder, **options):
    return ev.RunContext(tok, 128, torch.device('cpu'), 'fp32', FinetuneConfig(**options), cache=folder)


def _counted(encode, calls):
    return lambda: calls.append(1) or encode()


def _types(x):
    "The structure of `x` with the exact type of every value (a tuple is not a list, a bool not an int)."
    if isinstance(x, dict): return ('dict', [(k, _types(v)) for k, v in x.items()])
    if isinstance(x, (list, tuple)): return (type(x).__name__, [_types(v) for v in x])
    return type(x).__name__


@pytest.mark.parametrize('case', list(CASES))
def test_every_head_kinds_features_come_back_from_the_cache_exactly(tok, tmp_path, case):
    task, kind, options = CASES[case]
    run, train = _run(tok, tmp_path, **options), TASKS[task].load()['train']
    fresh = ev.KINDS[kind].features(train, run)
    calls = []
    first = run.features(f'train {kind}', train, _counted(lambda: ev.KINDS[kind].features(train, run), calls))
    again = run.features(f'train {kind}', train, _counted(lambda: ev.KINDS[kind].features(train, run), calls))
    assert len(calls) == 1 and again == fresh and first == fresh
    assert _types(again) == _types(fresh)


def test_retrieval_texts_and_empty_features_come_back_exactly(tok, tmp_path):
    run, calls = _run(tok, tmp_path), []
    texts = ['a query', 'another one', '']
    fresh = enc.encode_texts(texts, tok, 128, 'Query: ')
    for _ in range(2):
        assert run.features('texts Query: ', texts, _counted(lambda: enc.encode_texts(texts, tok, 128, 'Query: '), calls)) == fresh
        assert enc.cached_features(tmp_path, dict(what='none'), _counted(lambda: [], calls)) == []
    assert len(calls) == 2


def test_a_feature_the_format_cannot_hold_is_refused_naming_it(tmp_path):
    with pytest.raises(TypeError, match=r"feature 'label' of example 1 is 'pos' \(str\)"):
        enc.cached_features(tmp_path, dict(what='x'), lambda: [dict(label=1), dict(label='pos')])


class _Planted:
    "A pickle that writes a file when it is loaded."
    def __init__(self, marker): self.marker = str(marker)
    def __reduce__(self): return (exec, (f"open({self.marker!r}, 'w').write('ran')",))


def test_item5_a_planted_pickle_in_the_cache_runs_nothing_and_is_replaced(tmp_path):
    folder, marker, calls = tmp_path/'features', tmp_path/'pwned', []
    encode = _counted(lambda: [dict(input_ids=[1, 2, 3], label=1)], calls)
    enc.cached_features(folder, dict(what='sequence'), encode)
    files = sorted(folder.iterdir())
    for p in files: p.write_bytes(pickle.dumps(_Planted(marker)))     # a replaced cache file
    with pytest.warns(RuntimeWarning, match=files[0].name):
        assert enc.cached_features(folder, dict(what='sequence'), encode) == [dict(input_ids=[1, 2, 3], label=1)]
    assert not marker.exists() and len(calls) == 2
    assert enc.cached_features(folder, dict(what='sequence'), encode) and len(calls) == 2   # rebuilt file: reused


def test_item8_changing_one_label_outside_any_sample_misses_the_cache(tok, tmp_path):
    run, calls = _run(tok, tmp_path), []
    train = TASKS['rt_sentiment'].load()['train']
    assert len(train) == 3200
    encode = lambda ex: _counted(lambda: enc.encode_sequence(ex, tok, 128), calls)
    run.features('train sequence', train, encode(train))
    changed = [dict(ex) for ex in train]
    changed[5]['label'] = 1 - changed[5]['label']                    # not one of the 16 the old key sampled
    feats = run.features('train sequence', changed, encode(changed))
    assert len(calls) == 2 and feats[5]['label'] == changed[5]['label']
    assert run.features('train sequence', [dict(ex) for ex in changed], encode(changed)) == feats and len(calls) == 2


def _flip(path, at):
    raw = bytearray(path.read_bytes()); raw[at % len(raw)] ^= 1 << random.Random(at).randrange(8); path.write_bytes(bytes(raw))


def test_item9_a_flipped_byte_anywhere_is_named_in_a_warning_and_the_file_rebuilt(tok, tmp_path):
    rng = random.Random(); seed = rng.randrange(10**6); rng.seed(seed)
    examples = TASKS['corpus_cloze'].load()['train'][:40]
    fresh = enc.encode_spans(examples, tok, 128)
    key, calls = dict(what='span', n=40), []
    encode = _counted(lambda: enc.encode_spans(examples, tok, 128), calls)
    enc.cached_features(tmp_path, key, encode)
    path, = tmp_path.iterdir()
    size = path.stat().st_size
    positions = [0, 10, 40, 80, size // 2, size - 1] + [rng.randrange(size) for _ in range(24)]   # header, payload, end
    for at in positions:
        _flip(path, at)
        with pytest.warns(RuntimeWarning, match=path.name) as seen:
            assert enc.cached_features(tmp_path, key, encode) == fresh, (seed, at)
        assert 'rebuilt' in str(seen[0].message), (seed, at)
    assert len(calls) == 1 + len(positions), seed
    for damage in (b'', b'garbage', path.read_bytes()[:size // 3]):     # empty, not ours, truncated
        path.write_bytes(damage)
        with pytest.warns(RuntimeWarning, match=path.name):
            assert enc.cached_features(tmp_path, key, encode) == fresh
    assert enc.cached_features(tmp_path, key, encode) == fresh and len(calls) == 4 + len(positions)


# -------------------------------------- cache entries that cannot be used are logged misses (issue 34 item 9: N14, N16)
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


# ---------------------------------------------------------- the default feature cache is this user's (issue 34 item 11)
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


def test_the_default_cache_folder_is_made_for_this_user_alone_whatever_the_umask(tmp_path, monkeypatch):
    monkeypatch.delenv('MLMCLM_FEATURE_CACHE', raising=False)
    old = os.umask(0o002)   # a group-sharing umask, common on clusters
    try: folder = enc.feature_cache_dir(FinetuneConfig(results=str(tmp_path/'r.jsonl')), create=True)
    finally: os.umask(old)
    assert folder == tmp_path/'features'/f'uid-{os.getuid()}' and (folder.stat().st_mode & 0o777) == 0o700
    with warnings.catch_warnings():
        warnings.simplefilter('error')   # used again without a warning
        assert enc.feature_cache_dir(FinetuneConfig(results=str(tmp_path/'r.jsonl')), create=True) == folder
