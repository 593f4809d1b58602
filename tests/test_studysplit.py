"""Issue 36 (studysplit): the launcher computes a pretraining run's notebook parameters once (item 3 of the review)."""
import pytest

import mlmclm.study as study
from mlmclm.runs import PretrainRun
from mlmclm.study import build_plan, pretrain_params


def _branching_plan():
    # tiny-clm-10k-mlm40-42k branches from tiny-clm-42k's full state at (scaled) step 10k
    return build_plan('unit', {'E1': ['tiny-clm-42k'], 'E3': ['tiny-clm-10k-mlm40-42k']}, ('rt_sentiment',), ('rt_sentiment',),
                      lrs=(1e-3,), seeds=(0,), step_scale=1 / 2000, pretrain_preset='demo', finetune_preset='demo',
                      pretrain_overrides=dict(seq_len=32, batch_size=4, lr=2e-3, data='embedded', log_every=5))


def test_a_pretraining_run_gets_its_parameters_computed_once(tmp_path, monkeypatch):
    plan = _branching_plan()
    child = plan.runs['tiny-clm-10k-mlm40-42k']
    computed, executed = [], []
    def counted(*args, **kwargs):
        computed.append(args[1].name)
        return pretrain_params(*args, **kwargs)
    monkeypatch.setattr(study, 'pretrain_params', counted)
    monkeypatch.setattr(study, 'run_notebook', lambda notebook, params, out: executed.append((notebook, params)))
    study._run_pretraining(plan, tmp_path, child)       # nobody trains the parent: the child's notebook runs
    assert computed == [child.name]                      # before: twice (once more to look for the parent's worker)
    assert executed == [('02_pretrain.ipynb', dict(pretrain_params(plan, child, tmp_path), progress=False))]


def test_a_child_waits_for_a_parent_another_worker_trains_given_its_parameters(tmp_path):
    plan = _branching_plan()
    child = plan.runs['tiny-clm-10k-mlm40-42k']
    params = pretrain_params(plan, child, tmp_path)
    assert study._parent_in_other_hands(child, tmp_path, params) is None
    held = PretrainRun('tiny-clm-42k', tmp_path).try_claim()
    try:
        assert study._parent_in_other_hands(child, tmp_path, params) == 'tiny-clm-42k'
        with pytest.warns(UserWarning, match='skipped for now'): study._run_pretraining(plan, tmp_path, child)
    finally:
        held.release()
