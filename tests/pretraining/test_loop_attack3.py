"""Pretraining under the third fault attack (issue 34, items 2, 4, 5, 10 and 11 for pretraining; the cases N2, N3, N5,
N9, N11, N18, N19 and N20 of ../shared/faults/attack-3.md). Each test failed before its fix."""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from mlmclm.base.configs import ConfigError, build_config
from mlmclm.base.files import read_json, read_jsonl
from mlmclm.protocol.runs import PretrainConfig
from mlmclm.pretraining.loop import pretrain
from mlmclm.pretraining.setup import setup
from mlmclm.pretraining.train_state import StateError, seal_state

PY = sys.executable
TINY = dict(size='tiny', schedule='clm', total_steps=4, seq_len=32, batch_size=4, warmup_steps=1, decay_steps=1,
            data='embedded', progress=False, prefetch=0, log_every=1)   # the attack's $TINY: states at steps 1, 2 and 4


def _cfg(tmp, **kw):
    return build_config(PretrainConfig, {**TINY, 'out_dir': str(tmp), 'run_id': 'a', **kw})


def _metrics(folder) -> dict:
    return {r['step']: r for r in read_jsonl(Path(folder)/'metrics.jsonl')}


@pytest.fixture(scope='module')
def source(tmp_path_factory):
    "The attack's source run (lr 5e-3), with a checkpoint and its state at step 2."
    return pretrain(_cfg(tmp_path_factory.mktemp('source'), run_id='clm'))


# ---------------------------------------------------------------- item 2 (N2, N3)
NEW_SETTINGS = dict(lr=1e-3, adam_beta2=0.5, weight_decay=0.5)


def test_n2_a_branch_trains_at_its_own_lr_betas_and_weight_decay(source, tmp_path):
    branch = pretrain(_cfg(tmp_path, run_id='branch', checkpoint_steps='', resume_from=str(source/'checkpoints'/'step-2'),
                           **NEW_SETTINGS))
    old, new = _metrics(source), _metrics(branch)
    assert sorted(new) == [3, 4]
    assert (old[3]['lr'], new[3]['lr']) == (5e-3, 1e-3)                    # the constant phase, at each run's own peak
    assert new[3]['loss'] == old[3]['loss']                                # the same weights at step 2 ...
    assert new[4]['loss'] != old[4]['loss']                                # ... stepped under other settings
    assert read_json(branch/'run.json')['config']['lr'] == 1e-3


def test_n2_the_loaded_optimizer_holds_the_configs_settings_and_the_states_moments(source, tmp_path):
    run, state = setup(_cfg(tmp_path, run_id='branch', resume_from=str(source/'checkpoints'/'step-2'), adam_eps=1e-6,
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


def test_n3_resume_anyway_continues_under_the_new_settings(source, tmp_path):
    pretrain(_cfg(tmp_path, stop_at_step=2))                               # the source's first two steps, lr 5e-3
    with pytest.raises(ConfigError, match=r"'resume_anyway' \(continue its state under the new settings\)"):
        pretrain(_cfg(tmp_path, lr=1e-3))
    run = pretrain(_cfg(tmp_path, on_config_change='resume_anyway', **NEW_SETTINGS))
    old, new = _metrics(source), _metrics(run)
    assert [new[s]['loss'] for s in (1, 2, 3)] == [old[s]['loss'] for s in (1, 2, 3)]
    assert [new[s]['lr'] for s in (3, 4)] == [1e-3, 1e-3] and [old[s]['lr'] for s in (3, 4)] == [5e-3, 5e-3]
    assert new[4]['loss'] != old[4]['loss']
    record = read_json(run/'run.json')
    assert record['config']['lr'] == 1e-3 and [h['config']['lr'] for h in record['config_history']] == [5e-3]


def test_n2_a_plain_resume_and_a_branch_of_the_same_config_stay_bit_identical(source, tmp_path):
    pretrain(_cfg(tmp_path, stop_at_step=2))
    again = _metrics(pretrain(_cfg(tmp_path)))
    branch = _metrics(pretrain(_cfg(tmp_path, run_id='b', checkpoint_steps='', resume_from=str(source/'checkpoints'/'step-2'))))
    old = _metrics(source)
    assert [(again[s]['loss'], again[s]['lr']) for s in (3, 4)] == [(old[s]['loss'], old[s]['lr']) for s in (3, 4)]
    assert [(branch[s]['loss'], branch[s]['lr']) for s in (3, 4)] == [(old[s]['loss'], old[s]['lr']) for s in (3, 4)]


# ---------------------------------------------------------------- item 4 (N5)
def _texts(folder: Path, files: dict) -> Path:
    "A data folder of plain-text files (`files`: name -> seed of its made-up words)."
    import random
    words = 'the cat sat on a mat and the dog ran to see what it was while birds sang in green trees by water'.split()
    folder.mkdir(exist_ok=True)
    for name, seed in files.items():
        rng = random.Random(seed)
        (folder/name).write_text('\n\n'.join(' '.join(rng.choice(words) for _ in range(60)) + '.' for _ in range(30)))
    return folder


def test_n5_a_resume_whose_data_folder_changed_is_refused_naming_both_stores(tmp_path):
    txt = _texts(tmp_path/'txt', {'a.txt': 1, 'b.txt': 2})
    kw = dict(total_steps=6, data=str(txt), store_dir=str(tmp_path/'st'), checkpoint_steps='', save_every=3, heldout_rows=0)
    run = pretrain(_cfg(tmp_path, stop_at_step=3, **kw))
    old = read_json(run/'run.json')['data']
    _texts(txt, {'zz.txt': 3})                                   # the folder gains a file between the sessions
    with pytest.raises(StateError) as err:
        pretrain(_cfg(tmp_path, **kw))
    text = str(err.value)
    new = [p for p in (tmp_path/'st').iterdir() if p.is_dir() and str(p) != old['store']]
    assert len(new) == 1, list((tmp_path/'st').iterdir())
    for part in (f"read token store {old['store_id']} (folder {old['store']})", f'this run opened store',
                 f'({new[0]})', 'Nothing was read from it', "on_config_change='resume_anyway'", 'another run_id'):
        assert part in text, text
    assert read_json(run/'run.json')['data'] == old                                   # nothing rewritten
    # the advice works: given the store it read, it ends where an uninterrupted run on that store ends
    done = pretrain(_cfg(tmp_path, **{**kw, 'data': old['store']}, on_config_change='resume_anyway'))
    straight = pretrain(_cfg(tmp_path/'straight', **{**kw, 'data': old['store']}))
    assert [r['loss'] for r in read_jsonl(done/'metrics.jsonl')] == [r['loss'] for r in read_jsonl(straight/'metrics.jsonl')]


# ---------------------------------------------------------------- item 5 (N11, N20)
def _flip(path: Path) -> None:
    raw = bytearray(path.read_bytes()); raw[len(raw) // 2] ^= 0x40; path.write_bytes(bytes(raw))


def test_n11_seal_state_refuses_a_state_its_own_checksums_call_damaged(source, tmp_path):
    state = tmp_path/'src'/'checkpoints'/'step-2'/'state'
    shutil.copytree(source/'checkpoints'/'step-2'/'state', state)
    sealed = (state/'checksums.json').read_bytes()
    seal_state(state)                                                          # as written: sealing changes nothing
    assert (state/'checksums.json').read_bytes() == sealed
    _flip(next(state.glob('*.distcp')))
    (state/'added.bin').write_bytes(b'x')
    with pytest.raises(StateError) as err:
        seal_state(state)
    text = str(err.value)
    for part in (f'seal-state refuses {state}', 'says it is damaged', '__0_0.distcp fails its checksum',
                 'added.bin is not in it', f"delete {state/'checksums.json'}"):
        assert part in text, text
    assert (state/'checksums.json').read_bytes() == sealed                      # not blessed
    r = subprocess.run([PY, '-m', 'mlmclm.pretraining.loop', 'seal-state', str(state)], capture_output=True, text=True)
    assert r.returncode == 1 and '__0_0.distcp fails its checksum' in r.stderr and 'Traceback' not in r.stderr, r.stderr
    (state/'checksums.json').write_text('{"files": {')                          # an unreadable table is no licence either
    with pytest.raises(StateError, match='checksums.json is not readable JSON'):
        seal_state(state)


@pytest.mark.parametrize('case', ['a typo', 'a file', 'a checkpoint folder', 'a run folder', 'trainer.pt alone'])
def test_n20_seal_state_refuses_what_is_not_a_training_state_folder(source, tmp_path, case):
    ck = tmp_path/'run'/'checkpoints'/'step-2'
    shutil.copytree(source/'checkpoints'/'step-2', ck)
    (tmp_path/'notes.txt').write_text('x')
    (tmp_path/'half').mkdir(); (tmp_path/'half'/'trainer.pt').write_bytes(b'x')
    path, message = {'a typo': (tmp_path/'typo', 'it does not exist'),
                     'a file': (tmp_path/'notes.txt', 'it is a file, not a training-state folder'),
                     'a checkpoint folder': (ck, f"it is not a training state but holds one (a checkpoint's or a run's): {ck/'state'}"),
                     'a run folder': (tmp_path/'run', 'it is not a training-state folder: it has no trainer.pt and no .metadata'),
                     'trainer.pt alone': (tmp_path/'half', 'it is not a training-state folder: it has no .metadata (a state holds')}[case]
    files = sorted(p for p in tmp_path.rglob('*'))
    with pytest.raises(StateError, match=f'seal-state refuses {path}: ' + re_escape(message)):
        seal_state(path)
    assert sorted(p for p in tmp_path.rglob('*')) == files                       # nothing created


def re_escape(text: str) -> str:
    import re
    return re.escape(text)


def test_n20_a_sealed_checkpoint_folder_no_longer_breaks_its_resume(source, tmp_path):
    ck = tmp_path/'other'/'checkpoints'/'step-2'
    shutil.copytree(source/'checkpoints'/'step-2', ck)
    with pytest.raises(StateError): seal_state(ck)
    assert not (ck/'checksums.json').exists()
    run = pretrain(_cfg(tmp_path, run_id='b', checkpoint_steps='', resume_from=str(ck)))
    assert [_metrics(run)[s]['loss'] for s in (3, 4)] == [_metrics(source)[s]['loss'] for s in (3, 4)]


# ---------------------------------------------------------------- item 10, pretraining (N18, N19)
MLM = dict(schedule='mlm', total_steps=40, seq_len=16, batch_size=2, warmup_steps=1, decay_steps=1, checkpoint_steps='')


def test_n18_a_mask_ratio_under_one_percent_is_refused_before_any_work(tmp_path):
    with pytest.raises(ConfigError, match=r'mask_ratio=0.005 must be in \[0.01, 1\): phases are named in whole percents'):
        pretrain(_cfg(tmp_path, mask_ratio=0.005, **MLM))
    assert not (tmp_path/'a').exists()


def test_n18_a_mask_ratio_that_leaves_micro_batches_empty_is_refused_with_the_least_that_works(tmp_path):
    from mlmclm.pretraining.checks import check_pretrain_config
    with pytest.raises(ConfigError) as err:
        pretrain(_cfg(tmp_path, mask_ratio=0.05, **MLM))
    text = str(err.value)
    assert 'mask_ratio=0.05 (mlm5, 40 steps) with batch_size=2 x seq_len=16 = 32 tokens per micro-batch' in text, text
    assert 'would hold no masked token (each with probability 0.194)' in text and not (tmp_path/'a').exists()
    least = float(text.split('use mask_ratio >= ')[1].split(',')[0])
    check_pretrain_config(_cfg(tmp_path, mask_ratio=least, **MLM))             # the advice is enough
    with pytest.raises(ConfigError, match='would hold no masked token'):
        check_pretrain_config(_cfg(tmp_path, mask_ratio=least - 0.01, **MLM))
    check_pretrain_config(_cfg(tmp_path, mask_ratio=0.05, **{**MLM, 'batch_size': 16}))   # more tokens per micro-batch


def test_n18_an_empty_micro_batch_is_named_and_no_state_is_promised(tmp_path, monkeypatch):
    import mlmclm.pretraining.checks as session
    monkeypatch.setattr(session, 'EMPTY_BATCHES_ALLOWED', float('inf'))         # past the config check, as before it
    with pytest.raises(FloatingPointError) as err:
        pretrain(_cfg(tmp_path, mask_ratio=0.02, **MLM))
    text = str(err.value)
    assert 'has no masked token (2 rows x 16 tokens, mask_ratio=0.02), so its loss is 0/0' in text, text
    assert 'no state was saved yet' in text and 'state is kept' not in text and 'fix lr/data' not in text, text
    assert state_missing(tmp_path/'a')


def state_missing(run: Path) -> bool:
    return not (run/'state').exists()


def test_n18_a_diverged_step_names_the_state_that_exists(tmp_path, monkeypatch):
    import mlmclm.pretraining.loop as pt
    calls, real = [], pt.lm_loss
    def diverging(*args, **kw):
        loss, n = real(*args, **kw); calls.append(1)
        return (loss * float('nan') if len(calls) == 3 else loss), n
    monkeypatch.setattr(pt, 'lm_loss', diverging)
    with pytest.raises(FloatingPointError) as err:
        pretrain(_cfg(tmp_path, save_every=1, checkpoint_steps=''))
    text = str(err.value)
    assert 'non-finite loss nan at step 3 (clm): no micro-batch of this process was empty, so the training diverged' in text
    assert f"the last good state is kept in {tmp_path/'a'/'state'}" in text and (tmp_path/'a'/'state').is_dir(), text
    assert "on_config_change='resume_anyway' it goes on under the changed settings" in text, text
    monkeypatch.undo()                                                       # the advice holds: it goes on at a lower lr
    run = pretrain(_cfg(tmp_path, save_every=1, checkpoint_steps='', lr=1e-3, on_config_change='resume_anyway'))
    assert [(r['step'], r['lr']) for r in read_jsonl(run/'metrics.jsonl')][2:] == [(3, 1e-3), (4, 1e-3)]


def test_n19_an_init_from_checkpoint_with_a_nan_weight_is_refused_naming_the_tensor(source, tmp_path):
    from safetensors.torch import load_file, save_file
    ck = tmp_path/'nan'
    shutil.copytree(source/'checkpoints'/'step-2', ck, ignore=shutil.ignore_patterns('state'))
    weights = load_file(ck/'model.safetensors')
    weights['model.layers.0.mlp.down_proj.weight'][0, 0] = float('nan')
    save_file(weights, ck/'model.safetensors', metadata={'format': 'pt'})
    with pytest.raises(ConfigError, match=re_escape(f"init_from={str(ck)!r} has weights that are not finite (1 tensors, "
                                                    f"e.g. model.layers.0.mlp.down_proj.weight)")):
        pretrain(_cfg(tmp_path, init_from=str(ck)))
    assert not (tmp_path/'a').exists()                                          # before the data and the run folder


# ---------------------------------------------------------------- item 11, the state part (N9)
OTHER = 12345   # a uid no one on this machine has


def _chown(path: Path, uid: int = OTHER) -> None:
    for p in [path, *path.rglob('*')]: os.lchown(p, uid, -1)


class _Planted:   # unpickling it writes a file: the proof that code ran
    def __init__(self, marker): self.marker = str(marker)
    def __reduce__(self): return (exec, (f"open({self.marker!r}, 'w').write('ran')",))


needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="giving a folder to another user needs root")


@needs_root
def test_n9_a_branch_from_another_users_state_is_refused_unless_trusted(source, tmp_path):
    other = tmp_path/'other'
    shutil.copytree(source, other)
    _chown(other/'checkpoints'/'step-2'/'state')
    branch = dict(run_id='branch', checkpoint_steps='', resume_from=str(other/'checkpoints'/'step-2'))
    with pytest.raises(StateError) as err:
        pretrain(_cfg(tmp_path, **branch))
    text = str(err.value)
    for part in (f"belongs to user '{OTHER}' (uid {OTHER}), not to you", 'unpickles', f"trust_state_from='{OTHER}'",
                 "'any'", 'init_from='):
        assert part in text, text
    assert not (tmp_path/'branch').exists()                                     # refused before any work
    for trust in (str(OTHER), 'any'):
        run = pretrain(_cfg(tmp_path/trust, trust_state_from=trust, **branch))
        assert [_metrics(run)[s]['loss'] for s in (3, 4)] == [_metrics(source)[s]['loss'] for s in (3, 4)]


@needs_root
def test_n9_a_planted_and_resealed_pickle_in_another_users_state_never_runs(source, tmp_path):
    import pickle
    other, marker = tmp_path/'other', tmp_path/'PWNED'
    shutil.copytree(source, other)
    state = other/'checkpoints'/'step-2'/'state'
    (state/'.metadata').write_bytes(pickle.dumps(_Planted(marker)))
    (state/'checksums.json').unlink(); seal_state(state)                         # the co-writer reseals it
    _chown(state)
    with pytest.raises(StateError, match='belongs to user'):
        pretrain(_cfg(tmp_path, run_id='branch', checkpoint_steps='', resume_from=str(state.parent)))
    assert not marker.exists()


@needs_root
def test_n9_an_own_run_whose_state_another_user_wrote_into_is_refused_naming_the_file(tmp_path):
    run = pretrain(_cfg(tmp_path, stop_at_step=2, checkpoint_steps=''))
    os.lchown(run/'state'/'.metadata', OTHER, -1)                              # one file of it, not the folder
    with pytest.raises(StateError, match=re_escape(f"{run/'state'/'.metadata'} belongs to user '{OTHER}'")):
        pretrain(_cfg(tmp_path, checkpoint_steps=''))
    done = pretrain(_cfg(tmp_path, checkpoint_steps='', trust_state_from=f'root,{OTHER}'))   # a session field
    assert read_json(done/'run.json')['resumed_at'] == 2


def test_n9_trust_state_from_names_users_of_this_system(tmp_path):
    from mlmclm.pretraining.checks import check_pretrain_config
    from mlmclm.pretraining.train_state import trusted_uids
    with pytest.raises(ConfigError, match="trust_state_from='root,no-such-user-x' names 'no-such-user-x', no user of this system"):
        check_pretrain_config(_cfg(tmp_path, trust_state_from='root,no-such-user-x'))
    assert trusted_uids(None) == {os.geteuid()} and trusted_uids(' any ') is None
    assert trusted_uids(f'root, {OTHER}') == {os.geteuid(), 0, OTHER}
