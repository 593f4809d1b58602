"""Rendering the figures and tables (`mlmclm.report.render`): figures are rows of the registry
`mlmclm.report.render.FIGURES` that `render_all`, the tests and the docs read (issue 36 item 1); the figures command
draws what it can, lists the rest, and leaves no results table when rendering fails."""
import json
import re
import subprocess
import sys
from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd
import pytest

import mlmclm.report.render as render
from mlmclm.base.files import append_jsonl, project_root
from mlmclm.report.render import FIGURES, FigureSpec, render_all
from mlmclm.results.store import read_results

from result_rows import row

ROOT = project_root()
DEMO = project_root()/'figures'/'demo'
REFERENCE = Path(__file__).parents[1]/'fixtures'/'demo'   # the committed demo results (the demo rewrites figures/demo/*.csv)


# ------------------------------------------------------------------------------------------- the figure registry

def test_render_all_draws_the_rows_of_the_registry(monkeypatch, tmp_path):
    "A figure added to the registry is drawn and saved by `render_all`; nothing else is drawn."
    def toy(scores, scale):
        fig, ax = plt.subplots()
        ax.set_title(f'{len(scores)} scores at {scale} scale')
        return fig
    saved = []
    monkeypatch.setattr(render, 'FIGURES', {'figT_toy': FigureSpec('figT_toy', toy, ('scores', 'scale'), None)})
    monkeypatch.setattr(render, 'save_figure', lambda fig, folder, name, close=True: saved.append(
        (name, fig.axes[0].get_title())) or [])
    render_all(read_results(REFERENCE/'results.csv'), tmp_path, 'demo')
    assert len(saved) == 1 and saved[0][0] == 'figT_toy' and re.fullmatch(r'\d+ scores at demo scale', saved[0][1])
    plt.close('all')


def test_the_docs_show_the_registrys_demo_figures():
    "The figures notebook lists every figure the demo carries, in the registry's order; the README's are among them."
    nb = json.loads((project_root()/'nbs'/'report'/'00_figures.ipynb').read_text(encoding='utf-8'))
    listed = [m for c in nb['cells'] if c['cell_type'] == 'markdown' and 'Every figure of the committed demo' in ''.join(c['source'])
              for m in re.findall(r'\]\(\.\./\.\./figures/demo/(\w+)\.png\)', ''.join(c['source']))]
    assert listed == [n for n, f in FIGURES.items() if f.demo]
    assert all((DEMO/f'{n}.png').is_file() and (DEMO/f'{n}.pdf').is_file() for n in listed)
    index = json.loads((project_root()/'nbs'/'index.ipynb').read_text(encoding='utf-8'))
    shown = [m for c in index['cells'] for m in re.findall(r'!\[([^\]]*)\]\(figures/demo/(\w+)\.png\)', ''.join(c['source']))]
    assert shown and all(FIGURES[name].demo and FIGURES[name].paper == alt for alt, name in shown), shown


# ---------------------------------------------------------------- issue 17 (data loss, silent wrong answers), item 9
def test_item9_figures_render_what_they_can_and_list_the_rest(tmp_path):
    demo = pd.read_csv(ROOT/'tests'/'fixtures'/'demo'/'results.csv')   # the committed demo's table (a demo run rewrites figures/demo/)
    store = tmp_path/'results.jsonl'
    for r in demo.to_dict('records'): append_jsonl(store, r)
    append_jsonl(store, row(ck='my-own-model', ds='rt_sentiment', family='SC'))
    out = subprocess.run([sys.executable, '-m', 'mlmclm.report.render', '--results', str(store), '--out', str(tmp_path/'f')],
                         capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    assert 'my-own-model' in out.stdout + out.stderr
    assert (tmp_path/'f'/'fig2_mlm_vs_clm.png').is_file()
    assert 'my-own-model' not in (tmp_path/'f'/'results.csv').read_text()


def test_item9_figures_leave_no_results_csv_when_rendering_fails(tmp_path, monkeypatch):
    import mlmclm.report.render as figs
    demo = pd.read_csv(ROOT/'tests'/'fixtures'/'demo'/'results.csv')   # the committed demo's table (a demo run rewrites figures/demo/)
    store = tmp_path/'results.jsonl'
    for r in demo.to_dict('records'): append_jsonl(store, r)
    def broken(*a, **k): raise RuntimeError('renderer broke')
    monkeypatch.setattr(figs, 'render_all', broken)
    with pytest.raises(RuntimeError): figs.main(['--results', str(store), '--out', str(tmp_path/'f')])
    assert not (tmp_path/'f'/'results.csv').exists()
