"""Configs from settings (`mlmclm.base.configs`): names given as settings stay text, whatever they look like (third
fault attack, issue 34: N21 of ../shared/faults/attack-3.md)."""
import pytest

from mlmclm.base.configs import ConfigError, build_config, notebook_config
from mlmclm.protocol.runs import FinetuneConfig


# N21: names stay text --------------------------------------------------------------------------------------------
def test_numeric_looking_names_stay_text():
    from mlmclm.pretraining.loop import command_config
    cfg = command_config(['run_id=007', 'data=0042', 'out_dir=00', 'total_steps=4'])
    assert (cfg.run_id, cfg.data, cfg.out_dir, cfg.total_steps) == ('007', '0042', '00', 4)
    assert command_config(['run_id=1e3']).run_id == '1e3' and command_config(['run_id=1_000']).run_id == '1_000'
    with pytest.raises(ConfigError, match='checkpoint_name=610 came as a number'):
        build_config(FinetuneConfig, checkpoint_name=610)
    ns = dict(In=['# Parameters\ncheckpoint_name = 610\n'], checkpoint_name=610)   # what papermill -p makes of 0610
    with pytest.raises(ConfigError, match='-r checkpoint_name VALUE'): notebook_config(FinetuneConfig, ns)
    assert build_config(FinetuneConfig, lrs=0.001, seeds=0).lrs == '0.001'   # number lists still take numbers
