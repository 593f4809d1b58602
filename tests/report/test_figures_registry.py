"""Issue 43 item 4, the figure side: a figure registers beside its drawing function (`register_figure` in the
figures room), `render_all` draws every row of the registry, and the tests derive what they expect from it, so that
adding a figure breaks no test that is not about that figure."""
import ast
import importlib.util
import inspect
from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd
import pytest

import mlmclm
import mlmclm.report.render as render
from mlmclm.report.figures import FIGURES, FigureSpec, register_figure
from mlmclm.results.store import read_results

REFERENCE = Path(__file__).parents[1]/'fixtures'/'demo'


def test_each_figure_registers_where_its_function_is_defined():
    "The registration names the function right below it (or right after it, for a second figure of one function)."
    for name, spec in FIGURES.items():
        module = inspect.getmodule(spec.draw)
        calls = [n for n in ast.walk(ast.parse(inspect.getsource(module))) if isinstance(n, ast.Call)
                 and getattr(n.func, 'id', None) == 'register_figure' and n.args and getattr(n.args[0], 'value', None) == name]
        assert len(calls) == 1, (name, module.__name__)
        _, line = inspect.getsourcelines(spec.draw)
        assert abs(calls[0].lineno - line) <= 40, (name, calls[0].lineno, line)   # beside it, not in a table elsewhere


def test_the_registry_is_the_public_one_and_keeps_its_order():
    "The paper's figures in its order (the committed demo's files keep their names), ours last."
    assert mlmclm.FIGURES is render.FIGURES is FIGURES and mlmclm.FigureSpec is render.FigureSpec is FigureSpec
    assert list(FIGURES)[:3] == ['fig1_overview', 'fig2_mlm_vs_clm', 'fig3_mask_ratio']
    ours = [f.paper is None for f in FIGURES.values()]
    assert ours == sorted(ours), ours   # computed from the rows: a figure of ours added anywhere after the paper's keeps it true
    assert FIGURES['fig4b_data_efficiency_flops'].draw is FIGURES['fig4_data_efficiency'].draw


@pytest.fixture
def extra_figure():
    "A figure added as a contributor would: a function and its registration, not carried by the committed demo."
    @register_figure('figZ_extra', ('scores', 'scale'), None, demo=False)
    def fig_extra(scores, scale):
        fig, ax = plt.subplots(); ax.set_title(f'{len(scores)} family scores ({scale})')
        return fig
    yield 'figZ_extra'
    FIGURES.pop('figZ_extra')


def test_an_added_figure_is_drawn_and_the_others_still_are(extra_figure, monkeypatch, tmp_path):
    saved = []
    monkeypatch.setattr(render, 'save_figure', lambda fig, folder, name, close=True: saved.append(name) or plt.close(fig) or [])
    monkeypatch.setattr(render, 'write_table', lambda *a, **k: [])
    render.render_all(read_results(REFERENCE/'results.csv'), tmp_path, 'demo', cpt_loss=pd.read_csv(REFERENCE/'cpt_loss.csv'))
    assert saved == [n for n, f in FIGURES.items() if f.needs in (None, 'flops_per_step')] and saved[-1] == extra_figure


def test_the_committed_demo_test_expects_only_what_the_demo_carries(extra_figure, tmp_path):
    "The committed-demo rendering test passes with a figure the demo does not carry yet (it is drawn, not compared)."
    spec = importlib.util.spec_from_file_location('report_test_figures', Path(__file__).parent/'test_figures.py')
    module = importlib.util.module_from_spec(spec); spec.loader.exec_module(module)
    module.test_committed_demo_results_render_every_figure(tmp_path)
