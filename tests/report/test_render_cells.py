"""Issue 49 (fourth fault attack), the figures' cases: N7 (models fine-tuned under different budgets or dataset
revisions drawn side by side) and N15 (a checkpoint whose rows span two cells stopped the tables halfway). A figure or
table draws one cell: rows of several are refused before anything is written, naming each difference; `--cell`
chooses one. Each reproduction is the attack's, made small."""
import contextlib
import io

import matplotlib.pyplot as plt
import pytest

import mlmclm.report.render as render
import mlmclm.results.store as res
from mlmclm.base.configs import ConfigError
from result_rows import BUDGET, attack_store

def mk(store, systems, n=50, **kw):
    return attack_store(store, systems, n=n, **kw)


def figures_cli(*args) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try: code = render.main([str(a) for a in args]) or 0
        except SystemExit as e: code = e.code
    plt.close('all')
    return code, out.getvalue(), err.getvalue()


def test_two_budgets_and_two_revisions_are_refused_before_anything_is_written(tmp_path):   # N7
    store = mk(tmp_path/'d4.jsonl', ['610m-clm-42k'], p={'610m-clm-42k': .8}, **BUDGET, max_steps=200, dataset_revision='r1')
    mk(store, ['610m-mlm40-42k'], p={'610m-mlm40-42k': .6}, **BUDGET, max_steps=30, dataset_revision='r2')
    code, _, err = figures_cli('--results', store, '--out', tmp_path/'d4')
    assert code == 2 and not (tmp_path/'d4').exists(), err
    assert ('max_steps: 200 (610m-clm-42k), 30 (610m-mlm40-42k); '
            "dataset_revision on sst2: 'r1' (610m-clm-42k), 'r2' (610m-mlm40-42k)") in err, err
    assert '--cell max_steps=200' in err


def test_a_checkpoint_spanning_two_cells_is_refused_then_drawn_one_cell_at_a_time(tmp_path, monkeypatch):   # N15
    store = mk(tmp_path/'d5.jsonl', ['610m-clm-42k', '610m-mlm40-42k'], **BUDGET, max_steps=200)
    mk(store, ['610m-clm-42k'], seeds=(3, 4, 5), **BUDGET, max_steps=30)
    code, _, err = figures_cli('--results', store, '--out', tmp_path/'d5')
    assert code == 2 and not (tmp_path/'d5').exists() and 'max_steps: 200 (610m-clm-42k, 610m-mlm40-42k), 30 (610m-clm-42k)' in err
    drawn, tables = [], {}
    monkeypatch.setattr(render, 'save_figure', lambda fig, folder, name, close=True: drawn.append(name) or [])
    monkeypatch.setattr(render, 'write_table', lambda df, folder, name, caption: tables.__setitem__(name, df) or [])
    code, text, err = figures_cli('--results', store, '--out', tmp_path/'d5', '--cell', 'max_steps=200')
    assert code == 0, err
    assert drawn == [n for n, f in render.FIGURES.items() if f.needs in (None, 'flops_per_step')]   # every figure of the registry
    t2 = tables['T02_SC_pure_models']
    assert len(t2) == 2                                         # one row per model: the tables are whole
    assert set(res.read_results(tmp_path/'d5'/'results.csv').seed) == {0, 1, 2}   # the table beside them: that cell's rows
    code, _, err = figures_cli('--results', store, '--out', tmp_path/'d5', '--cell', 'max_steps=100')
    assert code == 2 and "max_steps='100': the rows hold max_steps = ['200', '30'] only" in err


def test_render_all_refuses_several_cells_and_draws_the_one_asked(tmp_path):
    store = mk(tmp_path/'d.jsonl', ['610m-clm-42k', '610m-mlm40-42k'], **BUDGET, max_steps=200)
    mk(store, ['610m-mlm40-42k'], seeds=(3,), **BUDGET, max_steps=30)
    rows = res.load_results(store)
    with pytest.raises(ConfigError, match=r'max_steps: 200 \(610m-clm-42k, 610m-mlm40-42k\), 30 \(610m-mlm40-42k\)'):
        render.render_all(rows, tmp_path/'out')
    assert not (tmp_path/'out').exists()
    files = render.render_all(rows, tmp_path/'out', cell=dict(max_steps=200))
    plt.close('all')
    assert (tmp_path/'out'/'tables'/'T02_SC_pure_models.md').is_file() and len(files) > 20
