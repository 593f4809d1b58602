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
    assert 'python3 .ci/timed.py test -- bash .ci/test' in script and 'python .ci/outputs.py test' in script
    assert 'nbdev_test' not in script.split('python .ci/outputs.py test')[1]   # the notebooks run once
    assert 'python3 .ci/timed.py demo -- bash .ci/demo' in (ROOT/'.ci'/'demo').read_text()
    shown = dict(cell_type='code', id='c1', metadata=dict(tags=['show']), execution_count=None, source=['print(6 * 7)'],
                 outputs=[dict(output_type='stream', name='stdout', text=['42\n'])])
    for name in ('a', 'b'):   # what it prints, through a pipe, as each notebook ends
        nb = dict(cells=[dict(cell_type='code', id='c0', metadata={}, execution_count=None, outputs=[], source=['assert 1 + 1 == 2']),
                         shown], metadata={}, nbformat=4, nbformat_minor=5)
        (tmp_path/f'{name}.ipynb').write_text(json.dumps(nb))
    run = lambda: subprocess.run([sys.executable, str(ROOT/'.ci'/'outputs.py'), 'test', str(tmp_path/'a.ipynb'), str(tmp_path/'b.ipynb')],
                                 cwd=ROOT, capture_output=True, text=True, env=dict(os.environ, PYTHONUNBUFFERED='1'), timeout=300)
    r = run()
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.count('- Completed') == 2 and 'a.ipynb: ' in r.stdout and '0 differ from a fresh run' in r.stdout
    shown['outputs'][0]['text'] = ['41\n']   # a saved output the code no longer gives fails the command, naming the cell
    (tmp_path/'b.ipynb').write_text(json.dumps(dict(cells=[shown], metadata={}, nbformat=4, nbformat_minor=5)))
    r = run()
    assert r.returncode == 1 and 'b.ipynb cell 0' in r.stdout and 'saved output differs from a fresh run' in r.stdout, r.stdout
