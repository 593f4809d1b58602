"""The commands of `.ci/`: the test and demo commands time themselves through `.ci/timed.py`, which records minutes,
load and exit status (the README reads them), and the test command prints a line as each notebook ends (issue 39
item 4)."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from mlmclm.base.files import project_root


ROOT = project_root()


def test_the_timed_wrapper_records_minutes_load_and_the_commands_exit_status(tmp_path):
    env = dict(os.environ, MLMCLM_TIMINGS_DIR=str(tmp_path))
    r = subprocess.run([sys.executable, str(ROOT/'.ci'/'timed.py'), 'probe', '--', sys.executable, '-c',
                        'import sys, time; time.sleep(0.2); sys.exit(3)'], capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 3, r.stderr
    entry = json.loads((tmp_path/'probe.json').read_text())
    assert entry['exit_status'] == 3 and entry['minutes'] >= 0 and entry['cores'] == os.cpu_count()
    if Path('/proc/loadavg').is_file(): assert len(entry['load']) == 2 and entry['load'][0] <= entry['load'][1]
    assert r.stdout.startswith('probe: ') and 'minutes' in r.stdout


def test_the_test_command_times_itself_and_prints_a_line_per_notebook(tmp_path):
    script = (ROOT/'.ci'/'test').read_text()
    assert 'python3 .ci/timed.py test -- bash .ci/test' in script and 'nbdev_test --n_workers 2 --timing --do_print' in script
    assert 'python3 .ci/timed.py demo -- bash .ci/demo' in (ROOT/'.ci'/'demo').read_text()
    for name in ('a', 'b'):   # what --do_print shows, through a pipe, as each notebook ends
        nb = dict(cells=[dict(cell_type='code', id='c0', metadata={}, execution_count=None, outputs=[], source=['assert 1 + 1 == 2'])],
                  metadata={}, nbformat=4, nbformat_minor=5)
        (tmp_path/f'{name}.ipynb').write_text(json.dumps(nb))
    nbdev_test = Path(sys.executable).parent/'nbdev_test'
    if not nbdev_test.is_file(): pytest.skip('nbdev_test is not installed beside this Python')
    r = subprocess.run([str(nbdev_test), '--path', str(tmp_path), '--n_workers', '2', '--timing', '--do_print'], cwd=ROOT,
                       capture_output=True, text=True, env=dict(os.environ, PYTHONUNBUFFERED='1'), timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.count('- Completed') == 2 and 'a.ipynb: ' in r.stdout
