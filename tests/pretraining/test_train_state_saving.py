"""How a pretraining run saves its training state (`mlmclm.pretraining.train_state`): the state at a kept step is the
checkpoint's state linked, not written twice (copied where links cannot be made), and resumes exactly; each process
hashes the shards it wrote; `save=False` saves nothing and trains the same; a full disk during a save is named as such
and leaves no temporary folder (issue 33 items 7 and 10, issue 34 item 10)."""
import errno
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import mlmclm.pretraining.loop as P
import mlmclm.pretraining.train_state as ST
from mlmclm.base.files import project_root, read_json, read_jsonl
from mlmclm.model.checkpoints import load
from mlmclm.protocol.runs import pretrain_config

from tiny import TINY_PRETRAIN

ROOT = project_root()
TINY = dict(TINY_PRETRAIN, heldout_rows=0)   # no held-out evaluation


def _run(tmp_path, **kw):
    return P.pretrain(pretrain_config(**{**TINY, 'schedule': 'clm', 'total_steps': 4, 'out_dir': str(tmp_path), **kw}))


def _weights(folder):
    return load(folder).state_dict()


def _same_files(a: Path, b: Path) -> bool:
    "Whether the state folders hold the same files, as hard links (checksums.json, shards, trainer.pt)."
    names = sorted(p.name for p in a.iterdir() if p.name != ST.COMPLETE)
    return names == sorted(p.name for p in b.iterdir() if p.name != ST.COMPLETE) and \
        all(os.path.samefile(a/n, b/n) for n in names)


def test_the_resume_state_at_a_kept_step_is_the_checkpoints_state_linked_and_resumes_exactly(tmp_path):
    whole = _run(tmp_path, run_id='whole', checkpoint_steps='2', save_every=4)
    assert _same_files(whole/'checkpoints'/'step-4'/'state', whole/'state')            # written once, linked
    assert not _same_files(whole/'checkpoints'/'step-2'/'state', whole/'state')
    ST.check_state(whole/'state')
    part = _run(tmp_path, run_id='part', checkpoint_steps='2', save_every=4, stop_at_step=2)
    assert _same_files(part/'checkpoints'/'step-2'/'state', part/'state')
    part = _run(tmp_path, run_id='part', checkpoint_steps='2', save_every=4)              # resumes from the link
    assert [m['step'] for m in read_jsonl(part/'metrics.jsonl')] == [1, 2, 3, 4]
    a, b = _weights(whole/'checkpoints'/'step-4'), _weights(part/'checkpoints'/'step-4')
    assert all(torch.equal(a[k], b[k]) for k in a)
    # the link replaced by a later save: the checkpoint keeps its files
    assert P.torch.load(part/'checkpoints'/'step-2'/'state'/'trainer.pt', weights_only=True)['step'] == 2


def test_where_links_cannot_be_made_the_state_is_copied(tmp_path, monkeypatch):
    link = os.link
    def no_links_into_state(src, dst):                     # as if state/ were on another file system than checkpoints/
        if '.state.tmp-' in str(dst): raise OSError(errno.EXDEV, 'Invalid cross-device link', str(src))
        return link(src, dst)
    monkeypatch.setattr(os, 'link', no_links_into_state)
    run = _run(tmp_path, run_id='r', checkpoint_steps='', save_every=4)
    kept, state = run/'checkpoints'/'step-4'/'state', run/'state'
    names = sorted(p.name for p in kept.iterdir())
    assert names == sorted(p.name for p in state.iterdir() if p.name != ST.COMPLETE)
    assert all((kept/n).read_bytes() == (state/n).read_bytes() and not os.path.samefile(kept/n, state/n) for n in names)
    ST.check_state(state)


def test_a_damaged_state_does_not_send_you_to_the_checkpoint_it_is_linked_to(tmp_path):
    run = _run(tmp_path, run_id='r', checkpoint_steps='2', save_every=4)
    with open(run/'state'/'trainer.pt', 'r+b') as f: f.seek(10); f.write(b'\xff')   # the same inode as step-4's
    with pytest.raises(ST.StateError) as e: ST.check_state(run/'state')
    assert f"cp -r {run/'checkpoints'/'step-2'/'state'} {run/'state'}" in str(e.value)   # not step-4, damaged alike


def test_save_false_writes_no_checkpoint_and_no_state_and_trains_the_same(tmp_path):
    quiet = _run(tmp_path, run_id='quiet', save=False, checkpoint_steps='1,2', save_every=1)
    assert sorted(p.name for p in quiet.iterdir()) == ['metrics.jsonl', 'run.json']    # no checkpoints/, state/, done.json
    saved = _run(tmp_path, run_id='saved', checkpoint_steps='1,2', save_every=1)
    assert [m['loss'] for m in read_jsonl(quiet/'metrics.jsonl')] == [m['loss'] for m in read_jsonl(saved/'metrics.jsonl')]
    assert read_json(quiet/'run.json')['config']['save'] is False


# run by torchrun: two processes under FSDP2; every SHA-256 noted by process
HASHES = textwrap.dedent('''
    import json, os, sys
    from pathlib import Path
    import mlmclm.pretraining.loop as P
    import mlmclm.pretraining.train_state as ST
    from mlmclm.protocol.runs import pretrain_config
    sha, rank, log = ST._sha256, os.environ['RANK'], Path(sys.argv[2])
    def noted(path):
        with open(log/f'{sys.argv[3]}-{rank}.txt', 'a') as f: f.write(Path(path).name + '\\n')
        return sha(path)
    ST._sha256 = noted
    P.pretrain(pretrain_config(**json.loads(sys.argv[1])))
''')


def test_each_process_hashes_the_shards_it_wrote_and_the_resume_check_is_shared(tmp_path):
    (tmp_path/'hashes.py').write_text(HASHES)
    values = dict(TINY, schedule='clm', total_steps=4, global_batch=8, checkpoint_steps='', save_every=2, fsdp=True,
                  out_dir=str(tmp_path), run_id='r')
    def session(name, **kw):
        cmd = [sys.executable, '-m', 'torch.distributed.run', '--standalone', '--nproc_per_node', '2',
               str(tmp_path/'hashes.py'), json.dumps({**values, **kw}), str(tmp_path), name]
        out = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=600, env={**os.environ, 'PYTHONPATH': str(ROOT)})
        assert out.returncode == 0, out.stderr[-4000:]
        return [(tmp_path/f'{name}-{r}.txt').read_text().split() for r in (0, 1)]
    first, second = session('first', stop_at_step=2), session('second')
    # saving step 2: each process its own shard; the main process also the files it wrote itself
    assert first == [['__0_0.distcp', '.metadata', 'trainer.pt'], ['__1_0.distcp']], first
    # resuming: each file of the state hashed once, by one of the two; then the step-4 checkpoint's state as above,
    # and the run's state/ linked to it (hashed no more)
    (share0, save0), (share1, save1) = (second[0][:-3], second[0][-3:]), (second[1][:-1], second[1][-1:])
    assert (save0, save1) == (['__0_0.distcp', '.metadata', 'trainer.pt'], ['__1_0.distcp']), second
    assert sorted(share0 + share1) == ['.metadata', '__0_0.distcp', '__1_0.distcp', 'trainer.pt'] and share0 and share1
    assert _same_files(tmp_path/'r'/'checkpoints'/'step-4'/'state', tmp_path/'r'/'state')


def test_a_full_disk_during_a_state_save_is_named_and_leaves_no_temporary_folder(tmp_path, monkeypatch):
    "The writer (DCP) fails the way a full disk makes it fail: the error names the disk, the folder and the free space."
    from torch.distributed.checkpoint.api import CheckpointException
    import torch.distributed.checkpoint as dcp
    run = _run(tmp_path, run_id='r', checkpoint_steps='', save_every=2, total_steps=6, stop_at_step=2)   # state at 2
    def full(state_dict, checkpoint_id):
        (Path(checkpoint_id)/'__0_0.distcp').write_bytes(b'partial')
        raise CheckpointException('CheckpointException', {0: (OSError(errno.ENOSPC, 'No space left on device'), None)})
    monkeypatch.setattr(dcp, 'save', full)
    with pytest.raises(OSError, match=r'the disk is full: writing \S+/r/state failed with [\d.]+ [MG]iB free of [\d.]+ [MG]iB '
                                      r'on the file system mounted at /.*, which holds \S+/r \(the writer said: '
                                      r'OSError: \[Errno 28\] No space left on device\)') as e:
        _run(tmp_path, run_id='r', checkpoint_steps='', save_every=2, total_steps=6)
    assert e.value.errno == errno.ENOSPC and f"{run/'state'} is unchanged" in str(e.value)
    assert 'The partial copy' in str(e.value) and 'was removed' in str(e.value)
    assert not [p.name for p in run.rglob('*.tmp-*')]                       # the partial copy is gone
    assert torch.load(run/'state'/'trainer.pt', weights_only=True)['step'] == 2 and ST.check_state(run/'state') is None


def test_another_write_error_is_left_as_it_is_and_its_temporary_folder_removed(tmp_path, monkeypatch):
    import torch.distributed.checkpoint as dcp
    def broken(state_dict, checkpoint_id): raise ValueError('a bug in the writer')
    monkeypatch.setattr(dcp, 'save', broken)
    monkeypatch.setattr(ST, 'FULL_DISK_BYTES', 0)        # whatever this machine's disk holds
    with pytest.raises(ValueError, match='a bug in the writer'):
        _run(tmp_path, run_id='r', checkpoint_steps='', save_every=2)
    assert not list((tmp_path/'r').rglob('*.tmp-*'))


def _can_mount_tmpfs() -> bool:
    try: return subprocess.run(['unshare', '-m', 'sh', '-c', 'mount -t tmpfs -o size=1m tmpfs /mnt'],
                               capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.SubprocessError): return False


@pytest.mark.skipif(not _can_mount_tmpfs(), reason='needs unshare -m and mount (root)')
def test_a_real_full_disk_a_small_tmpfs_is_named_and_cleaned(tmp_path):
    "On a 12 MiB tmpfs the tiny run's first state (about 35 MB) does not fit: torch's zip writer fails inside DCP."
    disk = tmp_path/'disk'; disk.mkdir()
    run = ' '.join(f'{k}={v}' for k, v in {**TINY, 'schedule': 'clm', 'total_steps': 4, 'checkpoint_steps': '',
                                           'save_every': 1, 'out_dir': disk, 'run_id': 'r',
                                           'store_dir': tmp_path/'stores'}.items())
    script = (f'mount -t tmpfs -o size=12m tmpfs {disk} && cd {ROOT} && {sys.executable} -m mlmclm.pretraining.loop run {run}; '
              f'echo "rc=$?"; ls -A {disk}/r')
    out = subprocess.run(['unshare', '-m', 'sh', '-c', script], capture_output=True, text=True, timeout=600,
                         env={**os.environ, 'PYTHONPATH': str(ROOT)})
    assert 'rc=1' in out.stdout, out.stdout + out.stderr[-3000:]
    assert f'OSError: [Errno 28] the disk is full: writing {disk}/r/state failed with' in out.stderr, out.stderr[-3000:]
    assert f'free of 12.0 MiB on the file system mounted at {disk} (tmpfs, tmpfs), which holds {disk}/r' in out.stderr
    assert sorted(out.stdout.split('rc=1')[1].split()) == ['metrics.jsonl', 'run.json'], out.stdout   # no .state.tmp-<pid>
