"""Issue 49, N9 and N24: what a merge writes is checked as what it reads, and a disk that fills during the write is said
in full. Before, `merge --any-sum` with huge weights wrote a checkpoint of infinities with exit status 0, and a full
disk ended in safetensors' "I/O error: No space left on device" without the folder."""
import os
import shlex
import shutil
import subprocess
import sys

import pytest

from mlmclm.base.configs import ConfigError
from mlmclm.base.files import project_root
from mlmclm.model.checkpoints import merge_checkpoints
from tiny import tiny_checkpoint

ROOT = project_root()
MLMCLM = [sys.executable, '-c', 'import sys; from mlmclm.cli import main; sys.exit(main(sys.argv[1:]))']   # `mlmclm`


@pytest.fixture(scope='module')
def parents(tmp_path_factory):
    tmp = tmp_path_factory.mktemp('merge')
    return tiny_checkpoint(tmp/'a', seed=0), tiny_checkpoint(tmp/'b', seed=1)


def test_n9_a_sum_past_float32_is_refused_before_anything_is_written(parents, tmp_path):
    a, b = parents
    with pytest.raises(ConfigError, match=r"merge weights='\[1e\+39, 1e\+39\]' has weights that are not finite \(\d+ "
                                          r"tensors, e\.g\. .*\) once summed: nothing was written; use smaller weights"):
        merge_checkpoints(tmp_path/'m', [(a, 1e39), (b, 1e39)], any_sum=True)
    assert list(tmp_path.iterdir()) == []
    res = subprocess.run([*MLMCLM, 'merge', str(tmp_path/'m'), f'{a}:1e39', f'{b}:1e39', '--any-sum'],
                         capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert res.returncode == 2 and res.stderr.startswith('error: merge weights='), res.stderr[-2000:]


def test_n24_a_full_disk_is_said_with_the_folder_and_its_free_space(parents, tmp_path, monkeypatch):
    "Safetensors' own error, as it says a full disk (a SafetensorError, no OSError)."
    import mlmclm.model.checkpoints as ck
    real = ck.save
    def full(model, path, **kw):
        real(model, path, **kw)
        raise RuntimeError('Error while serializing: I/O error: No space left on device (os error 28)')
    monkeypatch.setattr(ck, 'save', full)
    a, b = parents
    with pytest.raises(OSError) as e:
        merge_checkpoints(tmp_path/'m', [(a, 0.5), (b, 0.5)])
    assert str(e.value).startswith(f'[Errno 28] the disk is full: writing {tmp_path/"m"} failed with ')
    assert f'was removed and {tmp_path/"m"} was not written. Free space there, then merge again' in str(e.value)
    assert list(tmp_path.iterdir()) == []                                # the partial copy removed


def _can_mount_tmpfs() -> bool:
    if os.geteuid() != 0 or shutil.which('unshare') is None: return False
    return subprocess.run(['unshare', '-m', 'mount', '-t', 'tmpfs', '-o', 'size=1m', 'tmpfs', '/mnt'],
                          capture_output=True).returncode == 0


@pytest.mark.skipif(not _can_mount_tmpfs(), reason='needs root and a private mount namespace for a small tmpfs')
def test_n24_a_merge_onto_a_full_disk_through_the_command_line(parents, tmp_path):
    "The attack as written: a 4 MiB tmpfs, a merge of two checkpoints of 11 MB."
    a, b = parents
    full = tmp_path/'full'; full.mkdir()
    script = f'mount -t tmpfs -o size=4m tmpfs {full} && {shlex.join(MLMCLM)} merge {full}/merged {a}:0.5 {b}:0.5; rc=$?; ls -A {full}; exit $rc'
    res = subprocess.run(['unshare', '-m', 'bash', '-c', script], capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert res.returncode == 1, res.stderr[-3000:]
    assert 'Traceback' not in res.stderr, res.stderr[-3000:]
    assert res.stderr.startswith(f'error: [Errno 28] the disk is full: writing {full}/merged failed with '), res.stderr
    assert f'on the file system mounted at {full} (tmpfs, tmpfs)' in res.stderr and res.stdout == ''   # nothing left there
