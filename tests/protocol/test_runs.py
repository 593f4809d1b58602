"""The run configs and run identities (`mlmclm.protocol.runs`): numbers that would overflow far from where they were
given are refused in the config (issue 27 item 21)."""
import pytest

from mlmclm.base.configs import ConfigError
from mlmclm.protocol.runs import pretrain_config


@pytest.mark.parametrize('make, message', [
    (lambda: pretrain_config(seed=2**70), 'seed=1180591620717411303424 is out of range; allowed: >= 0 and <= 4294967295'),
    (lambda: pretrain_config(lr=1e300), 'lr=1e+300 is out of range; allowed: > 0.0 and <= 1.0'),
    (lambda: pretrain_config(mask_ratio=float('inf')), 'mask_ratio=inf is not a finite number'),
], ids=['seed 2**70', 'lr 1e300', 'mask ratio inf'])
def test_pretraining_numbers_that_would_overflow_later_are_refused_in_the_config(make, message):
    with pytest.raises(ConfigError) as e: make()
    assert message in str(e.value)
