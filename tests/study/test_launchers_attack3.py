"""Issue 34 item 10 (attack 3, N13): a second launcher on one study root, while a parent run trains in another worker,
skips the child whose start checkpoint does not exist yet instead of dying in its notebook."""
import warnings

import pytest

from mlmclm.protocol.runs import PretrainRun
from mlmclm.study.launchers import _parent_in_other_hands, launch
from mlmclm.study.plan import build_plan, pretrain_params


def _branching_plan():
    # tiny-clm-10k-mlm40-42k branches from tiny-clm-42k's full state at (scaled) step 10k
    return build_plan('unit', {'E1': ['tiny-clm-42k'], 'E3': ['tiny-clm-10k-mlm40-42k']}, ('rt_sentiment',), ('rt_sentiment',),
                      lrs=(1e-3,), seeds=(0,), step_scale=1 / 2000, pretrain_preset='demo', finetune_preset='demo',
                      pretrain_overrides=dict(seq_len=32, batch_size=4, lr=2e-3, data='embedded', log_every=5))


def test_a_child_whose_parent_another_worker_trains_is_skipped_not_crashed(tmp_path):
    plan = _branching_plan()
    child = plan.runs['tiny-clm-10k-mlm40-42k']
    assert child.parent == 'tiny-clm-42k' and child.branch_from
    assert _parent_in_other_hands(child, tmp_path, pretrain_params(plan, child, tmp_path)) is None          # nobody holds the parent: nothing to wait for
    held = PretrainRun('tiny-clm-42k', tmp_path).try_claim()             # a live worker trains the parent, no checkpoint yet
    assert held is not None
    try:
        assert _parent_in_other_hands(child, tmp_path, pretrain_params(plan, child, tmp_path)) == 'tiny-clm-42k'
        with pytest.warns(UserWarning, match='tiny-clm-10k-mlm40-42k: skipped for now: it starts from a checkpoint of tiny-clm-42k'):
            launch(plan, tmp_path, stages=('pretrain',), progress=False)   # before the fix: PapermillExecutionError
        assert not (tmp_path/'tiny-clm-10k-mlm40-42k').exists()            # the child did not start
        assert not list((tmp_path/'notebooks').glob('pretrain-tiny-clm-10k-*')) if (tmp_path/'notebooks').exists() else True
    finally:
        held.release()
