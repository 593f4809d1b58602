"""Rendering the figures and tables (`mlmclm.report.render`): figures are rows of the registry
`mlmclm.report.render.FIGURES` that `render_all`, the tests and the docs read (issue 36 item 1); the figures command
draws what it can, lists the rest, and leaves no results table when rendering fails; a store of your own runs is drawn
in its own units, an import of the authors' runs says what it lacks, and a store of both sources draws one and says so
(issue 39)."""
import json
import re
import subprocess
import sys
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import pytest
from matplotlib.collections import PathCollection
from matplotlib.container import BarContainer

import mlmclm.report.render as render
from mlmclm.base.files import append_jsonl, project_root
from mlmclm.report.render import FIGURES, FigureSpec, collect_cpt_loss, main, render_all
from mlmclm.results.store import read_results
from mlmclm.protocol.paper import FAMILIES, PAPER_DATASETS
from mlmclm.report.figures import fig_cpt_loss

from result_rows import OWN, own_rows, row

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


# ------------------------- issue 39 items 1, 2 and 5: figures of what the store holds, in its own units; what they lack
@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close('all')


def write_store(path: Path, rows) -> Path:
    path.write_text(''.join(json.dumps(r) + '\n' for r in rows))
    return path


def capture(results, scale='demo', cpt_loss=None, tmp=None, source=None):
    "render_all's figures and tables (with captions), kept instead of written."
    figs, tables = {}, {}
    def keep_figure(fig, folder, name, close=True): figs[name] = fig; return []
    def keep_table(df, folder, name, caption): tables[name] = (df, caption); return []
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(render, 'save_figure', keep_figure); mp.setattr(render, 'write_table', keep_table)
        render_all(results, tmp or Path('/nonexistent-unused'), scale=scale, cpt_loss=cpt_loss, source=source)
    return figs, tables


def texts(fig) -> str:
    return '\n'.join(t.get_text() for ax in fig.axes for t in ax.texts)


def test_the_figures_command_draws_a_store_of_your_own_run(tmp_path, capsys):
    "The README's two papermill lines leave one checkpoint of a config-named run: it was refused, now it is drawn."
    store = write_store(tmp_path/'results.jsonl', own_rows())
    main(['--results', str(store), '--out', str(tmp_path/'fig'), '--scale', 'demo'])
    out = capsys.readouterr().out
    assert 'left out' not in out and 'wrote' in out
    assert OWN in (tmp_path/'fig'/'tables'/'T10_SC_biphasic.md').read_text()


def test_an_own_biphasic_run_is_drawn_at_its_own_clm_share():
    figs, _ = capture(read_results_of(own_rows()))
    for fam, ax in zip(FAMILIES, figs['fig6_biphasic'].axes):
        line = next(l for l in ax.lines if l.get_label() == '336 steps (own units)')
        assert list(line.get_xdata()) == [25.0], fam            # 84 of 336 steps, not the paper's 23.8%
        assert np.isclose(line.get_ydata()[0], (0.40 + 0.05 * FAMILIES.index(fam)) * 100)
    bars = [b for ax in figs['figA1_biphasic_largest'].axes for c in ax.containers if isinstance(c, BarContainer) for b in c]
    assert sum(np.isfinite(b.get_height()) for b in bars) == 4   # the split, one bar per family; its pure ends are absent
    assert 'not in the store (tiny):\nCLM, MLM-40' in texts(figs['figA1_biphasic_largest'])


def read_results_of(rows) -> pd.DataFrame:
    return pd.DataFrame(rows)


def test_own_intermediate_checkpoints_are_drawn_against_their_own_steps():
    clm = [dict(objective='clm', steps=336, mask_ratio=None)]
    rows = (own_rows('tiny-clm-336-abcdef-step-336', 'tiny-clm-336-abcdef', clm, 336, 0.5)
            + own_rows('tiny-clm-336-abcdef-step-84', 'tiny-clm-336-abcdef', clm, 84, 0.3))
    figs, _ = capture(read_results_of(rows))
    fig = figs['fig4_data_efficiency']
    line = next(l for l in fig.axes[0].lines if l.get_label() == 'CLM')
    assert list(line.get_xdata()) == [84, 336]
    assert 'own units' in texts_of_figure(fig)
    assert not any(isinstance(c, PathCollection) for ax in fig.axes for c in ax.collections)   # no paper point in k


def texts_of_figure(fig) -> str:
    return '\n'.join(t.get_text() for t in fig.texts) + texts(fig)


def test_a_checkpoint_without_a_pretraining_record_is_still_left_out_by_name(tmp_path, capsys):
    store = write_store(tmp_path/'results.jsonl', own_rows(record=False))
    with pytest.raises(SystemExit):
        main(['--results', str(store), '--out', str(tmp_path/'fig'), '--scale', 'demo'])
    out = capsys.readouterr().out
    assert f'left out 1 checkpoint(s)' in out and 'no pretraining record' in out and OWN in out


def authors_rows(models, datasets_per_family=None) -> pd.DataFrame:
    "The authors' imported runs of `models`, every paper dataset, 2 seeds, known scores."
    rows = []
    for i, ck in enumerate(models):
        for f, fam in enumerate(FAMILIES):
            for ds in PAPER_DATASETS[fam]:
                for seed in (0, 1):
                    rows.append(dict(checkpoint_name=ck, dataset=ds, family=fam, lr=1e-4, seed=seed, val_score=0.5,
                                     test_score=0.5 + 0.05 * i + 0.01 * seed, best_step=None, steps=None, source='authors'))
    return pd.DataFrame(rows)


@pytest.fixture(scope='module')
def imported():
    "An import of the authors' 610m pure models alone: no intermediate checkpoint, no split, no 1B model."
    figs, tables = capture(authors_rows(['610m-clm-42k', '610m-mlm40-42k']), scale='authors')
    yield figs
    plt.close('all')


def test_fig4_draws_the_imported_final_models_and_names_what_is_absent(imported):
    for fam, ax in zip(FAMILIES, imported['fig4_data_efficiency'].axes):
        assert {l.get_label() for l in ax.lines} >= {'CLM', 'MLM'}, fam
        note = '\n'.join(t.get_text() for t in ax.texts)
        assert 'no intermediate checkpoints' in note and 'not in the store:\n610m-clm-42k-' in note, fam


def test_fig3_tells_the_papers_sizes_apart_in_the_legend(imported):
    fig = imported['fig3_mask_ratio']
    labels = {t.get_text() for t in fig.legends[0].get_texts()}
    assert {'paper: MLM, 210m', 'paper: MLM, 610m', 'paper: MLM, 1b', '610m'} <= labels
    assert 'not in the store:\n610m-mlm20-42k' in texts(fig)   # the 610m models of other ratios


def test_every_drawn_marker_has_a_legend_label(imported):
    for name, fig in imported.items():
        for ax in fig.axes:
            for c in ax.collections:
                if isinstance(c, PathCollection) and len(c.get_offsets()):
                    assert not c.get_label().startswith('_'), (name, ax.get_title())


def test_figures_with_nothing_to_draw_say_so_without_empty_unit_axes(imported):
    fig9 = imported['fig9_cpt_loss']
    assert not fig9.axes[0].axison and 'no CPT loss curves' in texts(fig9)
    a1 = imported['figA1_biphasic_largest']
    # no split of ours: the paper's largest 25% split (610m in its printed tables) beside our pure models of that size
    assert all(ax.axison and ax.get_ylim() != (0.0, 1.0) for ax in a1.axes)
    for ax in a1.axes:
        heights = [b.get_height() for c in ax.containers if isinstance(c, BarContainer) for b in c]
        assert np.isfinite(heights[:2]).all() and np.isnan(heights[2])
        assert [t.get_text() for t in ax.texts] == ['not in the store (610m):\nCLM→MLM']


def test_fig6_draws_the_pure_ends_and_says_where_the_store_has_no_split(imported):
    fig = imported['fig6_biphasic']
    assert 'no CLM-then-MLM-40 split\nin the store' in texts(fig)
    for ax in fig.axes:   # the imported 610m MLM-40 and CLM models at 0% and 100% CLM
        (line,) = [l for l in ax.lines if l.get_label() == '42k steps']
        assert list(line.get_xdata()) == [0.0, 100.0] and np.allclose(line.get_ydata(), [55.5, 50.5])


def test_fig9_draws_the_held_out_curve_the_runs_record(tmp_path):
    run = tmp_path/'tiny-clm-dec42k-mlm40-54k'; run.mkdir()
    rows = [dict(step=s, loss=7.0 + (0.3 if s % 20 else -0.3), heldout_loss=(6.9 - s / 1000) if s % 20 == 0 else None,
                 phase=0, objective='mlm') for s in range(10, 100, 10)]
    (run/'metrics.jsonl').write_text(''.join(json.dumps(r) + '\n' for r in rows))
    loss = collect_cpt_loss(tmp_path)
    assert loss.heldout_loss.notna().sum() == 4
    fig = fig_cpt_loss(loss, 'demo')
    ax = fig.axes[0]
    (line,) = ax.lines
    assert np.allclose(line.get_ydata(), [6.9 - s / 1000 for s in (20, 40, 60, 80)])   # the held-out rows only
    assert ax.get_ylabel() == 'held-out MLM loss (nats)'
    old = fig_cpt_loss(loss.drop(columns='heldout_loss'), 'demo')   # an older table: the batch loss, and the axis says so
    assert old.axes[0].get_ylabel() == 'batch MLM loss (nats)' and len(old.axes[0].lines[0].get_ydata()) == 9
    plt.close('all')


def test_table_1_says_at_demo_scale_that_it_holds_the_papers_settings():
    _, tables = capture(read_results_of(own_rows()))
    assert tables['T01_hyperparameters'][1].startswith("Table 1: hyperparameters of the paper's runs (the demo trains tiny")


# ---------------------------------------------------------------- issue 34 item 1: figures say whose rows they show
def test_figures_draw_one_source_and_say_which_when_a_store_holds_both(tmp_path):
    rows = authors_rows(['610m-clm-42k', '610m-mlm40-42k'])
    ours = rows.assign(source='ours', test_score=rows.test_score + 0.3)   # our runs of the same models, 30 points up
    both = pd.concat([rows, ours], ignore_index=True)
    for source, shift in ((None, 30.0), ('authors', 0.0)):
        figs, _ = capture(both, scale='authors', source=source)
        ax = figs['fig2_mlm_vs_clm'].axes[0]   # SC: MLM-40 (index 1) and CLM (index 0), seed mean 50.5 + 5 i
        heights = sorted(b.get_height() for c in ax.containers if isinstance(c, BarContainer) for b in c
                         if np.isfinite(b.get_height()))
        assert np.allclose(heights, [50.5 + shift, 55.5 + shift]), (source, heights)   # never an average of the two
        title = figs['fig2_mlm_vs_clm']._suptitle.get_text()
        assert ("our rows only, the store also holds the authors' (--source authors)" if source is None else
                "the authors' rows only, the store also holds our (--source ours)") in title
    with pytest.raises(ValueError, match=r"source='mine': the store holds rows of \['authors', 'ours'\] only"):
        capture(both, source='mine')
    alone, _ = capture(rows, scale='authors')
    assert 'rows only' not in alone['fig2_mlm_vs_clm']._suptitle.get_text()   # one source: nothing to say


def test_panels_say_when_none_of_the_stores_models_belong_to_them():
    "A store of one biphasic run: Figure 2 shows only the paper's markers and says so; Figure 5 has nothing to draw."
    figs, _ = capture(read_results_of(own_rows()))
    for ax in figs['fig2_mlm_vs_clm'].axes:
        assert [t.get_text() for t in ax.texts] == ["none of the store's models here"], ax.get_title()
    labels = {t.get_text() for t in figs['fig2_mlm_vs_clm'].legends[0].get_texts()}
    assert labels == {'paper: MLM', 'paper: CLM'}   # no legend entry for bars that are not there
    for fam, ax in zip(FAMILIES, figs['fig5_lr_stability'].axes):
        assert not ax.axison and [t.get_text() for t in ax.texts] == [f'no model of this figure\nin the store for {fam}']
