"""Issue 44 item 4: the committed demo outputs are exactly what the current code writes from the committed raw results.

The demo's runs give three tables (`results.csv`, the fine-tuning rows; `cpt_loss.csv` and `pretrain_loss.csv`, the
pretraining curves), and everything else in `figures/demo/` is drawn from them. So: the committed tables have the
columns the current code writes, and every committed figure and table is, byte for byte, what the current code draws
from the committed tables. A change to what the demo writes fails here until the committed files are regenerated:

    .venv/bin/mlmclm figures --results figures/demo/results.csv --out figures/demo --scale demo

(and, for a new column of the raw tables, a demo run). "Committed" is git's HEAD, never the working tree, which a demo
rerun on another CPU rewrites (its numbers may differ in their last digits); the raw tables are read from their copy in
`tests/fixtures/demo/`, which `test_figures.py` keeps equal to HEAD's."""
import subprocess
from pathlib import Path

import pandas as pd
import pytest

from mlmclm.base.files import project_root
from mlmclm.protocol.paper import TRAIN_ON
from mlmclm.protocol.runs import finetune_config, sweep_settings
from mlmclm.report.render import collect_cpt_loss, collect_pretrain_loss, main
from mlmclm.results.store import read_results, tidy_results
from mlmclm.study.launchers import finetune_params
from mlmclm.study.plan import get_plan
from mlmclm.tasks.registry import TASKS

ROOT = project_root()
REFERENCE = Path(__file__).parents[1]/'fixtures'/'demo'   # the committed raw tables (a copy no demo run rewrites)
RAW = ('results.csv', 'cpt_loss.csv', 'pretrain_loss.csv')   # what the demo's runs give; the rest is drawn from them
MEASURED = ('timings.json',)                                  # measured, not drawn
COMPARED = 'compare/'   # the demo under two numerics, by `mlmclm compare` (checked by tests/results/test_compare_demo.py)
REDRAW = '.venv/bin/mlmclm figures --results figures/demo/results.csv --out figures/demo --scale demo'


def _git(*args) -> bytes | None:
    try: r = subprocess.run(['git', *args], cwd=ROOT, capture_output=True, timeout=60)
    except (OSError, subprocess.SubprocessError): return None
    return r.stdout if r.returncode == 0 else None


def committed_files() -> list[str]:
    "The files of figures/demo/ at HEAD, relative to it."
    listed = _git('ls-tree', '-r', '--name-only', 'HEAD', 'figures/demo')
    if not listed: pytest.skip('not a git checkout, or no committed demo')
    files = sorted(Path(p).relative_to('figures/demo').as_posix() for p in listed.decode().split())
    return [f for f in files if not f.startswith(COMPARED)]


def committed(name: str) -> bytes:
    return _git('show', f'HEAD:figures/demo/{name}')


@pytest.fixture(scope='module')
def redrawn(tmp_path_factory) -> Path:
    "What `mlmclm figures` writes from the committed raw tables, as the demo's last step does (Figure 9 from cpt_loss.csv)."
    out = tmp_path_factory.mktemp('demo')
    (out/'cpt_loss.csv').write_bytes((REFERENCE/'cpt_loss.csv').read_bytes())
    main(['--results', str(REFERENCE/'results.csv'), '--out', str(out), '--scale', 'demo'])
    return out


def drawn_files(out: Path) -> list[str]:
    return sorted(p.relative_to(out).as_posix() for p in out.rglob('*') if p.is_file() and p.name not in RAW[1:])


def test_the_committed_demo_holds_exactly_the_files_the_code_draws_and_the_raw_tables(redrawn):
    drawn = drawn_files(redrawn)
    assert sorted(set(drawn) | set(RAW) | set(MEASURED)) == committed_files(), (
        'figures/demo/ at HEAD and what the code draws from its tables differ in their files: '
        f'only committed {sorted(set(committed_files()) - set(drawn) - set(RAW) - set(MEASURED))}, '
        f'only drawn {sorted(set(drawn) - set(committed_files()))}; run `{REDRAW}` and commit')


@pytest.mark.parametrize('kind', ['png', 'pdf', 'md', 'tex', 'csv'])
def test_every_committed_figure_and_table_is_what_the_code_draws_from_the_committed_tables(redrawn, kind):
    names = [n for n in drawn_files(redrawn) if n.endswith(f'.{kind}')]
    assert names
    differ = [n for n in names if committed(n) != (redrawn/n).read_bytes()]
    assert not differ, f'{differ}: not what the current code draws from the committed tables; run `{REDRAW}` and commit them'


def _rows_as_the_sweep_records_them(results: pd.DataFrame) -> pd.DataFrame:
    "The committed rows with the settings that the current demo's sweep records beside each (`sweep_settings`)."
    plan = get_plan('demo')
    configs = {e.recorded_name: finetune_config(**finetune_params(plan, e, Path('unused'))) for e in plan.evals}
    settings = [sweep_settings(configs[r.checkpoint_name], TASKS[TRAIN_ON.get(r.dataset, r.dataset)].max_length)
                for r in results.itertuples()]
    return pd.concat([results.reset_index(drop=True), pd.DataFrame(settings)], axis=1)


def test_the_committed_results_table_has_the_columns_the_current_demo_writes():
    results = read_results(REFERENCE/'results.csv')
    assert set(results.checkpoint_name) == {e.recorded_name for e in get_plan('demo').evals}   # every point, no other
    written = list(tidy_results(_rows_as_the_sweep_records_them(results.drop(columns=['max_length'], errors='ignore'))))
    assert list(results) == written, f'figures/demo/results.csv has the columns {list(results)}; a demo now writes {written}'


def test_the_committed_loss_tables_have_the_columns_the_current_demo_writes(tmp_path):
    assert list(pd.read_csv(REFERENCE/'cpt_loss.csv')) == list(collect_cpt_loss(tmp_path))
    assert list(pd.read_csv(REFERENCE/'pretrain_loss.csv')) == list(collect_pretrain_loss(tmp_path, 7.0))

