"""Rendering the figures and tables (`mlmclm.report.render`): figures are rows of the registry
`mlmclm.report.render.FIGURES` that `render_all`, the tests and the docs read (issue 36 item 1)."""
import json
import re
from pathlib import Path

import matplotlib.pyplot as plt

import mlmclm.report.render as render
from mlmclm.base.files import project_root
from mlmclm.report.render import FIGURES, FigureSpec, render_all
from mlmclm.results.store import read_results

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
