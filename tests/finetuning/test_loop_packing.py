"""Packed fine-tuning runs as padded fine-tuning runs: for each head kind on its embedded task, 10 optimizer steps
packed (token-budget micro-batches) and padded (one micro-batch per step) give the same training losses and the same
validation predictions; and a second run reuses the tokenized task while a changed tokenizer or limit misses it."""
import dataclasses

import numpy as np
import pytest

import mlmclm.finetuning.loop as ft
from mlmclm.protocol.runs import FinetuneConfig
import mlmclm.finetuning.evaluation as ev
from mlmclm.tasks.registry import TASKS

CASES = {   # id: (task, options)
    'SC mean': ('rt_sentiment', {}),
    'SC last': ('rt_sentiment', dict(pooling='last')),
    'TC': ('tweet_ner', {}),
    'QA tokens': ('corpus_cloze', {}),
    'QA spans': ('corpus_cloze', dict(qa_mode='squad')),
    'IR': ('corpus_retrieval', {}),
}


pytestmark = pytest.mark.usefixtures('one_thread')   # tiny models: one thread is faster (conftest.py)


@pytest.fixture(scope='module')
def setup():
    base, tok = ft._load_base(FinetuneConfig())
    data = {t: TASKS[t].load() for t, _ in CASES.values()}
    return base, tok, data


def _run(setup, task: str, tmp_path, **options):
    "10 steps of batch 8 at fp32; returns the result row and the training losses."
    base, tok, data = setup
    cfg = FinetuneConfig(**{**dict(max_steps=10, batch_size=8, micro_batch_size=8, max_eval_examples=100, precision='fp32',
                                      device='cpu', feature_cache=str(tmp_path/'features')), **options})
    losses = []
    row, = ft.finetune_run(TASKS[task], [TASKS[task]], data, base, tok, 1e-3, 0, cfg, losses=losses)
    return row, losses


@pytest.mark.parametrize('case', list(CASES))
def test_packed_and_padded_runs_give_the_same_losses_and_predictions(setup, case, tmp_path):
    task, options = CASES[case]
    # packed passes of one example's worth of tokens: a step's 8 examples are split over several micro-batches
    packed, packed_losses = _run(setup, task, tmp_path, packing=True, micro_batch_tokens=TASKS[task].max_length, **options)
    padded, padded_losses = _run(setup, task, tmp_path, packing=False, **options)
    assert (packed['packing'], padded['packing']) == (True, False)
    assert len(packed_losses) == len(padded_losses) == 10
    np.testing.assert_allclose(packed_losses, padded_losses, rtol=1e-4)
    same = np.mean(np.isclose(packed['val_scores_i'], padded['val_scores_i'], rtol=0, atol=1e-9))
    assert same >= 0.99, (case, same)
    assert abs(packed['val_score'] - padded['val_score']) <= 0.01 + 1e-9


def test_padded_accumulation_is_exact_whatever_the_micro_batch(setup, tmp_path):
    "Padded micro-batches of 2 and one of 8 accumulate the same batch loss (labelled tokens weigh by their count)."
    one, one_losses = _run(setup, 'tweet_ner', tmp_path, packing=False)
    four, four_losses = _run(setup, 'tweet_ner', tmp_path, packing=False, micro_batch_size=2)
    np.testing.assert_allclose(four_losses, one_losses, rtol=1e-4)


def test_a_second_run_reuses_the_tokenized_task_and_a_changed_key_misses(setup, tmp_path):
    base, tok, data = setup
    folder = tmp_path/'features'
    calls = []
    encode = ev.KINDS['sequence'].features
    kind = dataclasses.replace(ev.KINDS['sequence'], features=lambda ex, run: calls.append(run.max_length) or encode(ex, run))
    cfg = FinetuneConfig(max_steps=2, batch_size=8, max_eval_examples=8, device='cpu', feature_cache=str(folder))
    task = TASKS['rt_sentiment']
    run = lambda cfg, tok=tok: ft.finetune_run(task, [task], data, base, tok, 1e-3, 0, cfg)
    old, ev.KINDS['sequence'] = ev.KINDS['sequence'], kind
    try:
        first = run(cfg); files = sorted(p.name for p in folder.iterdir())
        assert len(calls) == 1 and files                                  # train, validation, test features written
        second = run(dataclasses.replace(cfg))
        assert len(calls) == 1 and sorted(p.name for p in folder.iterdir()) == files   # all reused, none added
        assert second[0]['test_score'] == first[0]['test_score']
        run(dataclasses.replace(cfg, max_length=64)); assert calls == [128, 64]          # another limit: a miss
        other = ft.load_tokenizer('embedded'); other.add_tokens(['<extra-token>'])      # another tokenizer: a miss
        run(cfg, tok=other); assert calls == [128, 64, 128]
        run(dataclasses.replace(cfg, feature_cache='off')); assert len(calls) == 4      # no cache: tokenized again
    finally:
        ev.KINDS['sequence'] = old
