"""Setting a pretraining run up (`mlmclm.pretraining.setup`): the optimizer loaded from a state holds the config's
settings and the state's moments (issue 34 item 2, N2); run.json records each phase's own FLOPs; a one-process FSDP
run and an estimate above the card's memory are said aloud (issue 33 items 6 and 7)."""
import warnings

import pytest

import mlmclm.pretraining.setup as S
from mlmclm.pretraining.setup import setup
from mlmclm.base.files import read_json
from mlmclm.model.sizes import flops_per_token
from mlmclm.protocol.runs import pretrain_config

from tiny import NEW_SETTINGS, TINY_PRETRAIN, tiny_run_cfg

TINY = dict(TINY_PRETRAIN, heldout_rows=0)   # no held-out evaluation


def test_n2_the_loaded_optimizer_holds_the_configs_settings_and_the_states_moments(source, tmp_path):
    run, state = setup(tiny_run_cfg(tmp_path, run_id='branch', resume_from=str(source/'checkpoints'/'step-2'), adam_eps=1e-6,
                                    adam_beta1=0.8, **NEW_SETTINGS))
    try:
        opt = run.optimizer.optimizer
        assert state.step == 2
        assert [(g['lr'], g['initial_lr'], g['betas'], g['eps'], g['weight_decay']) for g in opt.param_groups] == \
               [(1e-3, 1e-3, (0.8, 0.5), 1e-6, 0.5), (1e-3, 1e-3, (0.8, 0.5), 1e-6, 0.0)]   # norms are never decayed
        assert run.scheduler.base_lrs == [1e-3, 1e-3] and run.scheduler.get_last_lr() == [1e-3, 1e-3]
        moments = [opt.state[p] for g in opt.param_groups for p in g['params']]
        assert all(float(m['step']) == 2 and m['exp_avg_sq'].abs().sum() > 0 for m in moments)   # Adam's moments kept
    finally: run.release()


def _setup(tmp_path, **kw):
    "A run set up (model built, run.json written) but not trained; its claim released."
    run, state = S.setup(pretrain_config(**{**TINY, 'out_dir': str(tmp_path), 'run_id': 'r', **kw}))
    run.release()
    return run


# ---------------------------------- issue 33 items 6 and 7: each phase's own FLOPs in run.json, warnings of one process
def test_run_json_records_each_phases_own_flops_per_token(tmp_path):
    run = _setup(tmp_path, schedule='biphasic', clm_steps=3, total_steps=8, mask_ratio=0.3)
    record = read_json(run.folder/'run.json')
    cfg = run.raw_model.config
    clm, mlm = flops_per_token(cfg, 32, 'clm'), flops_per_token(cfg, 32, 'mlm', 0.3, sparse_head=True)
    assert mlm < clm                                             # the sparse head: the LM head at 30% of the positions
    assert [(p['objective'], p['steps'], p['flops_per_token']) for p in record['phases']] == [('clm', 3, clm), ('mlm', 5, mlm)]
    assert record['flops_per_token'] == pytest.approx((3 * clm + 5 * mlm) / 8)
    dense = read_json(_setup(tmp_path/'dense', schedule='mlm', total_steps=4, sparse_head=False).folder/'run.json')
    assert dense['phases'][0]['flops_per_token'] == dense['flops_per_token'] == clm   # no sparse head: CLM's cost


def test_one_process_fsdp_is_said_aloud(tmp_path, capsys):
    with pytest.warns(RuntimeWarning, match='fsdp=True but this session runs one process: nothing is sharded'):
        _setup(tmp_path, schedule='clm', total_steps=4, fsdp=True)
    assert 'WARNING: fsdp=True' in capsys.readouterr().err
    with warnings.catch_warnings():
        warnings.simplefilter('error', RuntimeWarning)
        _setup(tmp_path/'plain', schedule='clm', total_steps=4)   # nothing to say


def test_an_estimate_above_the_cards_memory_is_said_aloud_with_the_numbers(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(S, '_device_memory', lambda device: 2**20)   # a card of 1 MiB
    with pytest.warns(RuntimeWarning, match=r'estimated peak 0\.\d GiB per process \(\w+, none over 1, .*more than the '
                                            r'0\.000977 GiB of cpu: the run will likely run out of memory'):
        _setup(tmp_path, schedule='clm', total_steps=4)
    assert 'set ce_chunk or gradient_checkpointing=True' in capsys.readouterr().err
    monkeypatch.setattr(S, '_device_memory', lambda device: 80 * 2**30)
    with warnings.catch_warnings():
        warnings.simplefilter('error', RuntimeWarning)
        _setup(tmp_path/'fits', schedule='clm', total_steps=4)
