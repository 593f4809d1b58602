"""A toy row for the objective table and one for the task table, written where a researcher who extends the study
writes them, to show that the tests and demonstrations of the tables' rooms compute from the tables instead of pinning
their contents (issue 43 item 4: adding a row breaks no test that is not about that row). Two ways in:

- a pytest plugin: the rows are in the tables before any test is collected (as a row written into the table's
  notebook and exported is), e.g. `PYTHONPATH=$PWD:tests/package python -m pytest -p toy_rows tests/...`;
- `write_rows_into`: a copy of a table's own notebook with the row written into the table's cell, to run as
  `nbdev_test` runs it (a table's notebook defines the table itself, so rows added to the module do not reach it).

Each row is written first in its table: a row may go anywhere, so no test may rely on the table's last rows.
`tests/package/test_extending.py` runs both."""
import json
import shutil
import tempfile
from pathlib import Path

TOY_OBJECTIVE, TOY_TASK = 'nexttok', 'my_reviews'   # names no test or notebook uses for a row of its own
TOY_LABELS = ('bad', 'good')
OBJECTIVE_ROW = ("Objective('nexttok', 'NextTok', causal=False, masked=False, next_token=True, "
                 "source='tests/package/toy_rows.py')")
OPENERS = {'objective': 'OBJECTIVES = {o.name: o for o in [', 'task': 'TASKS: dict[str, Task] = {t.name: t for t in ['}
_ROWS = {}   # what the plugin added, to take away at the end


def task_row(repo: str) -> str:
    "The toy SC task's row, its data the hub-layout repo `repo`, read by the public loader."
    return (f"Task('my_reviews', 'SC', 'sequence', hub_sentence_classification({repo!r}, {TOY_LABELS!r}, text='review', "
            f"label='verdict'), {TOY_LABELS!r}, max_length=32)")


def write_repo(folder: Path) -> str:
    "The toy dataset as the hub lays out a repo: a Parquet file per split under `data/`."
    import pandas as pd
    (folder/'data').mkdir(parents=True)
    for split, n in (('train', 16), ('validation', 4), ('test', 4)):
        rows = dict(review=[f'the play was {TOY_LABELS[i % 2]} on night {i}' for i in range(n)], verdict=[i % 2 for i in range(n)])
        pd.DataFrame(rows).to_parquet(folder/'data'/f'{split}-00000-of-00001.parquet', index=False)
    return str(folder)


def write_rows_into(notebook: Path, out: Path, repo: str) -> Path:
    "A copy of `notebook` at `out` with the toy row written first into each table its cells define; at least one."
    nb = json.loads(Path(notebook).read_text(encoding='utf-8'))
    rows, found = dict(objective=OBJECTIVE_ROW, task=task_row(repo)), []
    for cell in nb['cells']:
        src = ''.join(cell['source'])
        for table, opener in OPENERS.items():
            if cell['cell_type'] == 'code' and opener in src:
                src = src.replace(opener, f'{opener}\n    {rows[table]},', 1)
                found.append(table)
        cell['source'] = src.splitlines(keepends=True)
    assert found, f'{notebook} defines neither table'
    out.write_text(json.dumps(nb, indent=1), encoding='utf-8')
    return out


def _first(table: dict, name: str, row) -> None:
    "Write `row` as the table's first row."
    rest = dict(table)
    table.clear(); table.update({name: row, **rest})


def add_toy_rows() -> dict:
    "Add both rows to the tables (the task's data in a temporary folder); returns them."
    import mlmclm.protocol.schedules as schedules
    import mlmclm.tasks.registry as registry
    folder = Path(tempfile.mkdtemp(prefix='toy-rows-'))
    objective = eval(OBJECTIVE_ROW, vars(schedules))                      # the same text as in the notebooks
    task = eval(task_row(write_repo(folder/'repo')), vars(registry))
    assert TOY_OBJECTIVE not in schedules.OBJECTIVES and TOY_TASK not in registry.TASKS
    _first(schedules.OBJECTIVES, TOY_OBJECTIVE, objective), _first(registry.TASKS, TOY_TASK, task)
    _ROWS.update(folder=folder)
    return dict(objective=objective, task=task)


def remove_toy_rows() -> None:
    from mlmclm.protocol.schedules import OBJECTIVES
    from mlmclm.tasks.registry import TASKS
    OBJECTIVES.pop(TOY_OBJECTIVE, None), TASKS.pop(TOY_TASK, None)
    if 'folder' in _ROWS: shutil.rmtree(_ROWS.pop('folder'), ignore_errors=True)


def pytest_configure(config): add_toy_rows()


def pytest_unconfigure(config): remove_toy_rows()


def pytest_terminal_summary(terminalreporter):   # said at the end, where `-q` still prints it
    from mlmclm.protocol.schedules import OBJECTIVES
    from mlmclm.tasks.registry import TASKS
    terminalreporter.write_line(f'toy rows (tests/package/toy_rows.py) were in the tables: '
                                f'{list(OBJECTIVES)[0] == TOY_OBJECTIVE and list(TASKS)[0] == TOY_TASK}')
