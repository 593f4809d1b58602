"""Resuming and branching pretraining runs (`mlmclm.pretraining.loop`): a branch from another run's checkpoint trains at
its own learning rate, betas and weight decay; `on_config_change='resume_anyway'` continues a state under new settings;
a plain resume and a branch of the same config stay bit-identical (the third fault attack, issue 34 item 2: N2, N3 of
../shared/faults/attack-3.md; each test failed before its fix)."""
import pytest

from mlmclm.base.configs import ConfigError
from mlmclm.base.files import read_json
from mlmclm.pretraining.loop import pretrain

from tiny import NEW_SETTINGS, metrics_of, tiny_run_cfg


def test_n2_a_branch_trains_at_its_own_lr_betas_and_weight_decay(source, tmp_path):
    branch = pretrain(tiny_run_cfg(tmp_path, run_id='branch', checkpoint_steps='', resume_from=str(source/'checkpoints'/'step-2'),
                                   **NEW_SETTINGS))
    old, new = metrics_of(source), metrics_of(branch)
    assert sorted(new) == [3, 4]
    assert (old[3]['lr'], new[3]['lr']) == (5e-3, 1e-3)                    # the constant phase, at each run's own peak
    assert new[3]['loss'] == old[3]['loss']                                # the same weights at step 2 ...
    assert new[4]['loss'] != old[4]['loss']                                # ... stepped under other settings
    assert read_json(branch/'run.json')['config']['lr'] == 1e-3


def test_n3_resume_anyway_continues_under_the_new_settings(source, tmp_path):
    pretrain(tiny_run_cfg(tmp_path, stop_at_step=2))                               # the source's first two steps, lr 5e-3
    with pytest.raises(ConfigError, match=r"'resume_anyway' \(continue its state under the new settings\)"):
        pretrain(tiny_run_cfg(tmp_path, lr=1e-3))
    run = pretrain(tiny_run_cfg(tmp_path, on_config_change='resume_anyway', **NEW_SETTINGS))
    old, new = metrics_of(source), metrics_of(run)
    assert [new[s]['loss'] for s in (1, 2, 3)] == [old[s]['loss'] for s in (1, 2, 3)]
    assert [new[s]['lr'] for s in (3, 4)] == [1e-3, 1e-3] and [old[s]['lr'] for s in (3, 4)] == [5e-3, 5e-3]
    assert new[4]['loss'] != old[4]['loss']
    record = read_json(run/'run.json')
    assert record['config']['lr'] == 1e-3 and [h['config']['lr'] for h in record['config_history']] == [5e-3]


def test_n2_a_plain_resume_and_a_branch_of_the_same_config_stay_bit_identical(source, tmp_path):
    pretrain(tiny_run_cfg(tmp_path, stop_at_step=2))
    again = metrics_of(pretrain(tiny_run_cfg(tmp_path)))
    branch = metrics_of(pretrain(tiny_run_cfg(tmp_path, run_id='b', checkpoint_steps='', resume_from=str(source/'checkpoints'/'step-2'))))
    old = metrics_of(source)
    assert [(again[s]['loss'], again[s]['lr']) for s in (3, 4)] == [(old[s]['loss'], old[s]['lr']) for s in (3, 4)]
    assert [(branch[s]['loss'], branch[s]['lr']) for s in (3, 4)] == [(old[s]['loss'], old[s]['lr']) for s in (3, 4)]
