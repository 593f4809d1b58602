"""The fine-tuning feature cache under attack (issue 27 items 5, 8, 9): a planted pickle, labels changed outside any
sample, flipped bytes; and the format's exact round trip of every head kind's features."""
import dataclasses
import pickle
import random

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
