"""The fine-tuning loop (`mlmclm.finetuning.loop`): its guard refuses non-finite or fractional sweep values and grids
that would overflow later."""
import pytest

import mlmclm.finetuning.loop as ft
from mlmclm.base.configs import ConfigError
from mlmclm.protocol.runs import finetune_config

from tiny import tiny_cfg


# ---------------------------------------------------------------- the guard
# Issue 27 item 21: numbers that would overflow far from where they were given.
@pytest.mark.parametrize('values, message', [
    (dict(seeds='1e30'), "seeds='1e30' holds 1e+30; seeds are whole numbers in [0, 4294967295]"),
    (dict(lrs='1e300'), "lrs='1e300' holds 1e+300; learning rates are numbers in (0, 1]"),
    (dict(lrs='1e-4,nan'), "lrs='1e-4,nan' holds nan"),
], ids=['seeds 1e30', 'lrs 1e300', 'lrs nan'])
def test_finetuning_grids_that_would_overflow_later_are_refused_by_the_guard(values, message):
    from mlmclm.finetuning.loop import check_finetune_config
    with pytest.raises(ConfigError) as e: check_finetune_config(finetune_config(**values))
    assert message in str(e.value)


# Issue 17 item 5: non-finite inputs passed fine-tuning.
@pytest.mark.parametrize('field, value', [('lrs', 'inf'), ('lrs', 'nan'), ('lrs', '1e-4,Infinity'), ('seeds', '0.7')])
def test_item5_non_finite_or_fractional_sweep_values_are_refused(tmp_path, field, value):
    with pytest.raises(ConfigError, match=f"{field}='{value}'"):
        ft.check_finetune_config(tiny_cfg(tmp_path, **{field: value}))
