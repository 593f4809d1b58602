"""The training state a pretraining run resumes from (`mlmclm.pretraining.train_state`) and what it refuses, naming why:
a state on other data (N5), `seal-state` on a state its checksums call damaged (N11) or on what is not a state folder
(N20), another user's state unless trusted (N9). The third fault attack (issue 34, items 4, 5 and 11 for pretraining;
the cases of ../shared/faults/attack-3.md); each test failed before its fix."""
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from mlmclm.base.configs import ConfigError
from mlmclm.base.files import read_json, read_jsonl
from mlmclm.pretraining.loop import pretrain
from mlmclm.pretraining.train_state import StateError, seal_state

from tiny import metrics_of, tiny_run_cfg


PY = sys.executable


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
    run = pretrain(tiny_run_cfg(tmp_path, stop_at_step=3, **kw))
    old = read_json(run/'run.json')['data']
    _texts(txt, {'zz.txt': 3})                                   # the folder gains a file between the sessions
    with pytest.raises(StateError) as err:
        pretrain(tiny_run_cfg(tmp_path, **kw))
    text = str(err.value)
    new = [p for p in (tmp_path/'st').iterdir() if p.is_dir() and str(p) != old['store']]
    assert len(new) == 1, list((tmp_path/'st').iterdir())
    for part in (f"read token store {old['store_id']} (folder {old['store']})", f'this run opened store',
                 f'({new[0]})', 'Nothing was read from it', "on_config_change='resume_anyway'", 'another run_id'):
        assert part in text, text
    assert read_json(run/'run.json')['data'] == old                                   # nothing rewritten
    # the advice works: given the store it read, it ends where an uninterrupted run on that store ends
    done = pretrain(tiny_run_cfg(tmp_path, **{**kw, 'data': old['store']}, on_config_change='resume_anyway'))
    straight = pretrain(tiny_run_cfg(tmp_path/'straight', **{**kw, 'data': old['store']}))
    assert [r['loss'] for r in read_jsonl(done/'metrics.jsonl')] == [r['loss'] for r in read_jsonl(straight/'metrics.jsonl')]


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
    with pytest.raises(StateError, match=f'seal-state refuses {path}: ' + re.escape(message)):
        seal_state(path)
    assert sorted(p for p in tmp_path.rglob('*')) == files                       # nothing created


def test_n20_a_sealed_checkpoint_folder_no_longer_breaks_its_resume(source, tmp_path):
    ck = tmp_path/'other'/'checkpoints'/'step-2'
    shutil.copytree(source/'checkpoints'/'step-2', ck)
    with pytest.raises(StateError): seal_state(ck)
    assert not (ck/'checksums.json').exists()
    run = pretrain(tiny_run_cfg(tmp_path, run_id='b', checkpoint_steps='', resume_from=str(ck)))
    assert [metrics_of(run)[s]['loss'] for s in (3, 4)] == [metrics_of(source)[s]['loss'] for s in (3, 4)]


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
        pretrain(tiny_run_cfg(tmp_path, **branch))
    text = str(err.value)
    for part in (f"belongs to user '{OTHER}' (uid {OTHER}), not to you", 'unpickles', f"trust_state_from='{OTHER}'",
                 "'any'", 'init_from='):
        assert part in text, text
    assert not (tmp_path/'branch').exists()                                     # refused before any work
    for trust in (str(OTHER), 'any'):
        run = pretrain(tiny_run_cfg(tmp_path/trust, trust_state_from=trust, **branch))
        assert [metrics_of(run)[s]['loss'] for s in (3, 4)] == [metrics_of(source)[s]['loss'] for s in (3, 4)]


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
        pretrain(tiny_run_cfg(tmp_path, run_id='branch', checkpoint_steps='', resume_from=str(state.parent)))
    assert not marker.exists()


@needs_root
def test_n9_an_own_run_whose_state_another_user_wrote_into_is_refused_naming_the_file(tmp_path):
    run = pretrain(tiny_run_cfg(tmp_path, stop_at_step=2, checkpoint_steps=''))
    os.lchown(run/'state'/'.metadata', OTHER, -1)                              # one file of it, not the folder
    with pytest.raises(StateError, match=re.escape(f"{run/'state'/'.metadata'} belongs to user '{OTHER}'")):
        pretrain(tiny_run_cfg(tmp_path, checkpoint_steps=''))
    done = pretrain(tiny_run_cfg(tmp_path, checkpoint_steps='', trust_state_from=f'root,{OTHER}'))   # a session field
    assert read_json(done/'run.json')['resumed_at'] == 2


def test_n9_trust_state_from_names_users_of_this_system(tmp_path):
    from mlmclm.pretraining.checks import check_pretrain_config
    from mlmclm.pretraining.train_state import trusted_uids
    with pytest.raises(ConfigError, match="trust_state_from='root,no-such-user-x' names 'no-such-user-x', no user of this system"):
        check_pretrain_config(tiny_run_cfg(tmp_path, trust_state_from='root,no-such-user-x'))
    assert trusted_uids(None) == {os.geteuid()} and trusted_uids(' any ') is None
    assert trusted_uids(f'root, {OTHER}') == {os.geteuid(), 0, OTHER}
