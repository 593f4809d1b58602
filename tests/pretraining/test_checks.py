"""The checks of a pretraining config before any work (`mlmclm.pretraining.checks`): bad parameters; mask ratios under
1% or too low to fill a micro-batch, a start checkpoint with a weight that is not finite (the third fault attack,
issue 34 item 10: N18, N19 of ../shared/faults/attack-3.md; each test failed before its fix)."""
import re
import shutil

import pytest

from mlmclm.base.configs import ConfigError, build_config
from mlmclm.pretraining.loop import pretrain
from mlmclm.pretraining.checks import check_pretrain_config
from mlmclm.protocol.runs import PretrainConfig

from tiny import SMALL_BATCH_MLM, tiny_run_cfg


def test_n18_a_mask_ratio_under_one_percent_is_refused_before_any_work(tmp_path):
    with pytest.raises(ConfigError, match=r'mask_ratio=0.005 must be in \[0.01, 1\): phases are named in whole percents'):
        pretrain(tiny_run_cfg(tmp_path, mask_ratio=0.005, **SMALL_BATCH_MLM))
    assert not (tmp_path/'a').exists()


def test_n18_a_mask_ratio_that_leaves_micro_batches_empty_is_refused_with_the_least_that_works(tmp_path):
    from mlmclm.pretraining.checks import check_pretrain_config
    with pytest.raises(ConfigError) as err:
        pretrain(tiny_run_cfg(tmp_path, mask_ratio=0.05, **SMALL_BATCH_MLM))
    text = str(err.value)
    assert 'mask_ratio=0.05 (mlm5, 40 steps) with batch_size=2 x seq_len=16 = 32 tokens per micro-batch' in text, text
    assert 'would hold no masked token (each with probability 0.194)' in text and not (tmp_path/'a').exists()
    least = float(text.split('use mask_ratio >= ')[1].split(',')[0])
    check_pretrain_config(tiny_run_cfg(tmp_path, mask_ratio=least, **SMALL_BATCH_MLM))             # the advice is enough
    with pytest.raises(ConfigError, match='would hold no masked token'):
        check_pretrain_config(tiny_run_cfg(tmp_path, mask_ratio=least - 0.01, **SMALL_BATCH_MLM))
    check_pretrain_config(tiny_run_cfg(tmp_path, mask_ratio=0.05, **{**SMALL_BATCH_MLM, 'batch_size': 16}))   # more tokens per micro-batch


def test_n19_an_init_from_checkpoint_with_a_nan_weight_is_refused_naming_the_tensor(source, tmp_path):
    from safetensors.torch import load_file, save_file
    ck = tmp_path/'nan'
    shutil.copytree(source/'checkpoints'/'step-2', ck, ignore=shutil.ignore_patterns('state'))
    weights = load_file(ck/'model.safetensors')
    weights['model.layers.0.mlp.down_proj.weight'][0, 0] = float('nan')
    save_file(weights, ck/'model.safetensors', metadata={'format': 'pt'})
    with pytest.raises(ConfigError, match=re.escape(f"init_from={str(ck)!r} has weights that are not finite (1 tensors, "
                                                    f"e.g. model.layers.0.mlp.down_proj.weight)")):
        pretrain(tiny_run_cfg(tmp_path, init_from=str(ck)))
    assert not (tmp_path/'a').exists()                                          # before the data and the run folder


# ---------------------------------------------------------------- bad parameters
@pytest.mark.parametrize('values, message', [
    (dict(schedule='bert'), "cannot read phase 'bert'"),
    (dict(mask_ratio=1.5), 'mask_ratio=1.5 is out of range'),
    (dict(schedule='biphasic', clm_steps=500, total_steps=100), 'clm_steps=500 must be in [1, total_steps-1]'),
    (dict(init_from='runs/does-not-exist'), "init_from='runs/does-not-exist' is not a local folder, and the hub is offline"),
    (dict(init_from='./runs/does-not-exist'), "init_from='./runs/does-not-exist' does not exist"),
    (dict(replace_mask=0.8), 'must be 1'),
])
def test_bad_parameters_fail_before_training(values, message, monkeypatch):
    monkeypatch.setenv('HF_HUB_OFFLINE', '1')   # 'runs/does-not-exist' could be a hub id; offline it cannot be
    with pytest.raises(ConfigError) as err:
        check_pretrain_config(build_config(PretrainConfig, values))
    assert message in str(err.value)
