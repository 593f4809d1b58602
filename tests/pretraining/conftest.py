"""Fixtures the pretraining tests share."""
import pytest

from mlmclm.pretraining.loop import pretrain

from tiny import tiny_run_cfg


@pytest.fixture(scope='session')
def source(tmp_path_factory):
    "The third fault attack's source run (lr 5e-3), its checkpoint and state at step 2 (tests copy it, never alter it)."
    return pretrain(tiny_run_cfg(tmp_path_factory.mktemp('source'), run_id='clm'))
