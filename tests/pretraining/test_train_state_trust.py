"""Issue 49, N2: a training state whose files the group or others may write is refused before anything in it is read,
with what to do; the trainer writes every state writable by its owner alone, whatever the umask. Before, the owner
check looked only at who owns a file: under umask 000 another user could rewrite `.metadata` (and `checksums.json`)
in place, and the owner's next plain resume unpickled it."""
import hashlib
import json
import os
import pickle
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

from mlmclm.base.configs import build_config
from mlmclm.pretraining.loop import pretrain
from mlmclm.pretraining.train_state import StateError
from mlmclm.protocol.runs import PretrainConfig

TINY = dict(size='tiny', schedule='clm', total_steps=8, seq_len=32, batch_size=4, warmup_steps=1, decay_steps=1,
            data='embedded', progress=False, prefetch=0, log_every=1, checkpoint_steps='', save_every=4)


def _cfg(tmp, **kw):
    return build_config(PretrainConfig, {**TINY, 'out_dir': str(tmp), 'run_id': 'own', **kw})


def _modes(folder: Path) -> dict:
    return {p.relative_to(folder.parent).as_posix(): stat.S_IMODE(p.lstat().st_mode) for p in [folder, *folder.rglob('*')]}


@pytest.fixture(scope='module')
def base(tmp_path_factory):
    "A run stopped at step 4 (its state, and a checkpoint carrying one), trained under umask 000."
    tmp = tmp_path_factory.mktemp('trust')
    old = os.umask(0)
    try: return pretrain(_cfg(tmp, stop_at_step=4, checkpoint_steps='4'))
    finally: os.umask(old)


@pytest.fixture
def run(base, tmp_path):
    "A copy of the base run (its modes kept) in this test's own folder."
    shutil.copytree(base, tmp_path/'own', copy_function=shutil.copy2)
    return tmp_path/'own'


def test_a_state_written_under_umask_000_is_writable_by_its_owner_alone(base):
    for state in (base/'state', base/'checkpoints'/'step-4'/'state'):
        others = {k: oct(m) for k, m in _modes(state).items() if m & 0o022}
        assert others == {}, others


class _Planted:   # what another user would put in .metadata: here it only leaves a mark
    def __init__(self, mark): self.mark = mark
    def __reduce__(self): return (open, (self.mark, 'w'))


def _rewrite_in_place(state: Path, mark: Path):
    "What another local user can do to files it may write: new bytes under the same owner, checksums to match."
    data = pickle.dumps(_Planted(str(mark)))
    with open(state/'.metadata', 'r+b') as f: f.truncate(0); f.write(data)
    table = json.loads((state/'checksums.json').read_text())
    table['files']['.metadata'] = dict(bytes=len(data), sha256=hashlib.sha256(data).hexdigest())
    with open(state/'checksums.json', 'r+') as f: f.truncate(0); f.write(json.dumps(table))


def test_n2_a_state_others_may_write_is_refused_before_it_is_read(run, tmp_path):
    for p in [run/'state', *(run/'state').rglob('*')]:                 # as a writer under umask 000 left it
        os.chmod(p, 0o777 if p.is_dir() else 0o666)
    mark = tmp_path/'PWNED'
    _rewrite_in_place(run/'state', mark)
    with pytest.raises(StateError) as e:
        pretrain(_cfg(tmp_path))                                       # the owner's plain resume
    assert not mark.exists()                                           # nothing was unpickled
    assert f"the training state {run/'state'} cannot be resumed: {run/'state'} may be written by others (mode 777" in str(e.value)
    assert f'make it writable by you alone and run again: chmod -R go-w {run/"state"}' in str(e.value)


def test_n2_the_advice_works_for_a_state_nobody_changed(run, tmp_path):
    os.chmod(run/'state'/'trainer.pt', 0o664)                          # group-writable (umask 002)
    with pytest.raises(StateError, match=r'trainer.pt may be written by its group \(mode 664'):
        pretrain(_cfg(tmp_path))
    subprocess.run(['chmod', '-R', 'go-w', str(run/'state')], check=True)   # what the message says to do
    assert (pretrain(_cfg(tmp_path))/'done.json').is_file()


def test_n2_a_branch_source_others_may_write_is_refused_when_the_config_is_checked(run, tmp_path):
    "resume_from another run's checkpoint: refused by the config check, before any data is read or model built."
    from mlmclm.base.configs import ConfigError
    from mlmclm.pretraining.checks import check_pretrain_config
    os.chmod(run/'checkpoints'/'step-4'/'state'/'.metadata', 0o646)
    with pytest.raises(ConfigError, match=r'\.metadata may be written by others \(mode 646'):
        check_pretrain_config(_cfg(tmp_path, run_id='child', resume_from=str(run/'checkpoints'/'step-4')))


@pytest.mark.skipif(os.geteuid() != 0 or not Path('/usr/sbin/runuser').exists(), reason='needs root to act as another user')
def test_n2_another_local_user_cannot_rewrite_a_state_written_under_umask_000(base):
    "The attack's first step, as another user: `nobody` may read the state but no longer write it."
    for p in reversed(base.parents):                                    # let `nobody` reach it (pytest's folders are 700)
        if str(p).startswith(('/tmp/', '/var/tmp/')): os.chmod(p, os.stat(p).st_mode | 0o005)
    meta = base/'state'/'.metadata'
    as_nobody = lambda code: subprocess.run(['runuser', '-u', 'nobody', '--', '/usr/bin/python3', '-c', code, str(meta)],
                                            capture_output=True, text=True)
    assert as_nobody("import sys; open(sys.argv[1], 'rb').read()").returncode == 0        # it reaches the file
    res = as_nobody("import sys; open(sys.argv[1], 'r+b').write(b'x')")
    assert res.returncode != 0 and 'Permission denied' in res.stderr, res.stderr
