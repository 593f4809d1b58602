"""Extending the study (issue 43 items 4 and 6). The guide, nbs/08_extending.ipynb, adds its rows through public
names only; and a toy row written into the objective table and one into the task table (tests/package/toy_rows.py,
as a researcher writes a permanent row) break none of the tests and notebook demonstrations of the tables' rooms,
since those compute their expectations from the tables instead of pinning their contents."""
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from mlmclm.base.files import project_root

ROOT = project_root()
HERE = Path(__file__).parent
# the tests that read the two tables, each whole but for one resumed training run of the schedules room (32 s)
SUITES = ['tests/tasks/test_registry.py', 'tests/pretraining/test_objectives.py', 'tests/protocol/test_schedules.py']
SKIP = 'not resumed_mid_phase'
# the tables' own notebooks, run with the toy row written into the table
TABLE_NOTEBOOKS = ['nbs/tasks/02_registry.ipynb', 'nbs/protocol/00_schedules.ipynb']
# notebooks that import a table and list its rows in an error, run with the rows added (7 minutes on 2 cores: `slow`)
READING_NOTEBOOKS = [pytest.param('nbs/bench/00_throughput.ipynb', marks=pytest.mark.slow)]


def _env() -> dict:
    return dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), str(HERE), os.environ.get('PYTHONPATH', '')]),
                MPLBACKEND='Agg', HF_HUB_OFFLINE='1', HF_DATASETS_OFFLINE='1', TOKENIZERS_PARALLELISM='false')


def _run(args: list, timeout: int = 900) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=timeout)


def test_the_guide_adds_its_rows_with_public_names_only():
    "Its dataset is a `Task` row whose loader is the public `hub_sentence_classification`; no private name is imported."
    cells = json.loads((ROOT/'nbs'/'08_extending.ipynb').read_text(encoding='utf-8'))['cells']
    code = '\n'.join(''.join(c['source']) for c in cells if c['cell_type'] == 'code')
    assert re.search(r"TASKS\['toy_reviews'\] = Task\([^)]*hub_sentence_classification\(", code)
    imported = [n for line in re.findall(r'from mlmclm[\w.]* import ([^\n]+)', code) for n in re.split(r'[,\s()]+', line)]
    assert 'TASKS' in imported and not [n for n in imported if n.startswith('_')], imported


def test_the_toy_rows_are_rows_like_any_other():
    "The plugin's rows are read by the package like shipped ones: the objective parses, the task resolves and loads."
    probe = ("import toy_rows; toy_rows.add_toy_rows()\n"
             "from mlmclm.protocol.schedules import parse_schedule\n"
             "from mlmclm.tasks.registry import TASKS, load_task_revision, resolve_tasks\n"
             "print([p.label for p in parse_schedule('clm:2,nexttok:2')], resolve_tasks('my_reviews'))\n"
             "data, rev = load_task_revision(TASKS['my_reviews'])\n"
             "print({s: len(data[s]) for s in ('train', 'validation', 'test')}, rev[:15]); toy_rows.remove_toy_rows()")
    out = _run(['-c', probe], timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.splitlines()[-2:] == ["['clm', 'nexttok'] ['my_reviews']",
                                            "{'train': 16, 'validation': 4, 'test': 4} content-sha256:"]


def test_a_row_added_to_each_table_breaks_no_test_of_their_rooms():
    "The rooms' tests, collected and run with the toy rows in the tables, pass unchanged."
    out = _run(['-m', 'pytest', '-p', 'toy_rows', *SUITES, '-k', SKIP, '-q', '-p', 'no:cacheprovider'])
    assert 'toy rows (tests/package/toy_rows.py) were in the tables: True' in out.stdout, out.stdout[-4000:]
    assert out.returncode == 0 and ' passed' in out.stdout, out.stdout[-4000:]


def _notebook_passes(setup: str, notebook: str) -> None:
    "Run `notebook` as `nbdev_test` does, in a process where `setup` ran first (it may name another notebook, `nb`)."
    script = ("import sys, toy_rows; from pathlib import Path; from nbdev.test import test_nb\n"
              f"nb = Path(sys.argv[1]).resolve()\n{setup}\n"
              "ok = test_nb(nb, skip_flags=['slow', 'gpu'])[0]; print('passed:', ok); sys.exit(not ok)")
    out = _run(['-c', script, notebook])
    assert out.returncode == 0 and out.stdout.strip().endswith('passed: True'), (out.stdout + out.stderr)[-4000:]


@pytest.mark.parametrize('notebook', TABLE_NOTEBOOKS)
def test_a_row_written_into_a_tables_notebook_breaks_none_of_its_demonstrations(notebook, tmp_path):
    "The table's notebook as a researcher leaves it after writing a row into the table, run as `nbdev_test` runs it."
    _notebook_passes(f"repo = toy_rows.write_repo(Path({str(tmp_path)!r})/'repo')\n"
                     f"nb = toy_rows.write_rows_into(nb, Path({str(tmp_path)!r})/nb.name, repo)", notebook)


@pytest.mark.parametrize('notebook', READING_NOTEBOOKS)
def test_a_row_added_to_each_table_breaks_no_demonstration_that_reads_it(notebook):
    _notebook_passes('toy_rows.add_toy_rows()', notebook)
