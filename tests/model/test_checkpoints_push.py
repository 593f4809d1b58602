"""Issue 49, N18-N20: `mlmclm push` fails with one clear line for every failure of the hub, and never writes the
checkpoint folder: the model card naming the hub id is made in memory and uploaded from a temporary folder. Before, a
machine without network got a raw httpx traceback; a folder the user may only read failed after the hub repository
was created; and a failed upload left the local card naming a hub id where nothing was."""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from mlmclm.base.files import project_root
from mlmclm.model.checkpoints import push_checkpoint
from tiny import tiny_checkpoint

ROOT = project_root()
PY = sys.executable
MLMCLM = [PY, '-c', 'import sys; from mlmclm.cli import main; sys.exit(main(sys.argv[1:]))']   # `mlmclm`


@pytest.fixture(scope='module')
def checkpoint(tmp_path_factory):
    return tiny_checkpoint(tmp_path_factory.mktemp('push')/'step-20')


def _tree(folder: Path) -> dict:
    "Every file of `folder` with its bytes and mtime: what a push must leave as it was."
    return {p.relative_to(folder).as_posix(): (p.read_bytes(), p.stat().st_mtime_ns) for p in sorted(folder.rglob('*'))}


class Hub:   # a hub that creates repositories, and takes (or drops) the upload
    def __init__(self, drop=None): self.drop, self.calls = drop, []
    def create_repo(self, repo_id, **kw): self.calls.append('create_repo')
    def upload_folder(self, folder_path, **kw):
        if self.drop: raise self.drop
        self.calls.append('upload_folder')
        self.files = sorted(p.relative_to(folder_path).as_posix() for p in Path(folder_path).rglob('*') if p.is_file())
        self.card = (Path(folder_path)/'README.md').read_text()
        return 'https://huggingface.co/someone/model/commit/1'


def test_n18_a_hub_that_cannot_be_reached_is_one_clear_line(checkpoint):
    "HF_HUB_OFFLINE unset, as on most machines without network; the hub's client raises httpx's errors, not OSError."
    env = {k: v for k, v in os.environ.items() if k != 'HF_HUB_OFFLINE'} | dict(HF_ENDPOINT='http://127.0.0.1:9')
    before = _tree(checkpoint)
    res = subprocess.run([*MLMCLM, 'push', str(checkpoint), 'someone/model', '--token', 'hf_none'],
                         capture_output=True, text=True, cwd=ROOT, env=env, timeout=600)
    assert res.returncode == 1, res.stderr[-2000:]
    assert 'Traceback' not in res.stderr, res.stderr[-2000:]
    assert res.stderr.startswith(f"mlmclm push: cannot push '{checkpoint}' to 'someone/model': the hub did not answer "
                                 f"(ConnectError: "), res.stderr
    assert 'nothing was uploaded' in res.stderr and _tree(checkpoint) == before


def test_n20_a_failed_upload_leaves_the_local_card_and_says_so(checkpoint):
    before = _tree(checkpoint)
    with pytest.raises(RuntimeError) as e:
        push_checkpoint(checkpoint, 'someone/model', api=Hub(drop=ConnectionResetError('connection reset by peer')))
    assert str(e.value) == (f"cannot push '{checkpoint}' to 'someone/model': the upload failed (ConnectionResetError: "
                            f"connection reset by peer); a hub commit lands whole or not at all, so nothing was uploaded, "
                            f"and '{checkpoint}' is as it was. Run the push again")
    assert _tree(checkpoint) == before


def test_a_push_uploads_the_card_naming_the_hub_id_and_leaves_the_folder(checkpoint):
    before, hub = _tree(checkpoint), Hub()
    assert push_checkpoint(checkpoint, 'someone/model', api=hub) == 'https://huggingface.co/someone/model/commit/1'
    assert hub.calls == ['create_repo', 'upload_folder']
    assert hub.files == sorted(before)                                   # every file of the checkpoint goes up
    assert "checkpoint = 'someone/model'" in hub.card and "checkpoint = 'someone/model'" not in (checkpoint/'README.md').read_text()
    assert _tree(checkpoint) == before


_PUSH = """
import sys
from mlmclm.model.checkpoints import push_checkpoint
class Hub:
    calls = []
    def create_repo(self, repo_id, **kw): self.calls.append('create_repo')
    def upload_folder(self, **kw):
        if sys.argv[2] == 'drop': raise ConnectionResetError('connection reset by peer')
        self.calls.append('upload_folder'); return 'https://huggingface.co/someone/model/commit/1'
try: print(push_checkpoint(sys.argv[1], 'someone/model', api=Hub()), Hub.calls)
except RuntimeError as e: print('refused:', e, Hub.calls)
"""


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which('setpriv') is None, reason='needs root and setpriv to drop its rights')
def test_n19_a_folder_the_user_may_only_read_pushes_as_it_is(checkpoint, tmp_path):
    "Another user's (or a published) checkpoint: the push must not need to write it. Root without its file rights stands in."
    shared = tmp_path/'shared'
    shutil.copytree(checkpoint, shared)
    subprocess.run(['chown', '-R', 'nobody', str(shared)], check=True)
    subprocess.run(['chmod', '-R', 'a-w', str(shared)], check=True)
    before = _tree(shared)
    reader = ['setpriv', '--bounding-set', '-dac_override,-dac_read_search,-fowner', '--', PY, '-c', _PUSH, str(shared)]
    ok = subprocess.run(reader + ['take'], capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert ok.stdout == "https://huggingface.co/someone/model/commit/1 ['create_repo', 'upload_folder']\n", ok.stderr[-2000:]
    dropped = subprocess.run(reader + ['drop'], capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert dropped.stdout.startswith(f"refused: cannot push '{shared}' to 'someone/model': the upload failed"), dropped.stderr[-2000:]
    assert _tree(shared) == before
