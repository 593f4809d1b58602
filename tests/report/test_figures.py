"""Figures and tables draw exactly the runs they should: a synthetic score grid in which every (checkpoint, family)
has its own known score, read back from the drawn artists and the written tables. Plus the committed demo results
re-render into every figure and table, byte-stably, and a checkpoint of your own run is described by its recorded
config, in its own steps.

The committed demo's tables are read from `tests/fixtures/demo/` (a copy of `figures/demo/results.csv` and `cpt_loss.csv`),
never from `figures/demo/`: `bash .ci/demo` rewrites that folder, and the tests must pass before and after it. After
committing a new demo run, refresh the copy: `cp figures/demo/{results,cpt_loss,pretrain_loss}.csv tests/fixtures/demo/`
(`test_the_reference_tables_are_the_committed_demo_tables` fails until then)."""
import json
import subprocess
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.collections import LineCollection, PolyCollection
from matplotlib.container import BarContainer

import mlmclm.report.figures as figures
import mlmclm.report.render as render
from mlmclm.base.files import project_root
from mlmclm.report.figures import checkpoint_meta, paper_flops_per_step
from mlmclm.results.paper_runs import reported_scores
from mlmclm.report.render import FIGURES, main, render_all, study_scores
from mlmclm.results.store import read_results, tidy_results
from mlmclm.report.tables import protocol_gaps
from mlmclm.protocol.paper import (BUDGETS, E3_STEPS, FAMILIES, PAPER_DATASETS, RATIOS, SIZES, paper_checkpoints,
                                   paper_experiments)

from result_rows import OWN, own_rows

DEMO = project_root()/'figures'/'demo'                  # the demo writes here (figures and tables; a rerun rewrites them)
REFERENCE = Path(__file__).parents[1]/'fixtures'/'demo'          # the committed demo's tables, which no demo run overwrites
REFERENCE_TABLES = ('results.csv', 'cpt_loss.csv', 'pretrain_loss.csv')   # the README's numbers too (.ci/docs.py)
CHECKPOINTS = paper_checkpoints(appendix=True)   # the 50 published checkpoints and the appendix's 1B biphasic run


def _score(i: int, f: int) -> float:
    "The known family score (percent) of checkpoint i in family f: unique, and never one of the paper's 2-decimal numbers."
    return 20 + i + 0.1 * f + 0.0123


def grid(checkpoints=CHECKPOINTS, lrs=(1e-4,), qed=True) -> pd.DataFrame:
    "Every checkpoint x the 12 datasets (+ the authors' qed, not in the paper) x LRs x 2 seeds; means are `_score`."
    rows = []
    for i, ck in enumerate(checkpoints):
        for f, fam in enumerate(FAMILIES):
            datasets = list(PAPER_DATASETS[fam]) + (['qed'] if fam == 'QA' and qed else [])
            for d, ds in enumerate(datasets):
                off = (d - 1) * 0.5 if ds != 'qed' else 70.0           # dataset offsets cancel in the family mean
                for lr in lrs:
                    for seed, s_off in ((0, -0.2), (1, 0.2)):          # and so do the seed offsets
                        test = (_score(i, f) + off + s_off) / 100
                        rows.append(dict(checkpoint_name=ck, dataset=ds, family=fam, lr=lr, seed=seed,
                                         val_score=0.5 if lr == lrs[0] else 0.4, test_score=test, best_step=None, steps=None, source='authors',
                                         in_paper=ds != 'qed'))
    return pd.DataFrame(rows)


NAME_OF = {round(_score(i, f), 4): ck for i, ck in enumerate(CHECKPOINTS) for f in range(len(FAMILIES))}


def names(values) -> list[str]:
    "The checkpoints whose known scores these are (KeyError: a value no single checkpoint has, e.g. an average)."
    return [NAME_OF[round(float(v), 4)] for v in values if not np.isnan(v)]


def lines(ax) -> dict:
    "Each drawn line of an axis: its label -> the checkpoints on it (seaborn's unlabeled lines are `_child<i>`)."
    return {l.get_label(): sorted(names(l.get_ydata())) for l in ax.lines if len(l.get_ydata())}


def bars(ax) -> list[str]:
    return sorted(names(b.get_height() for c in ax.containers if isinstance(c, BarContainer) for b in c))


@pytest.fixture(scope='module')
def drawn(tmp_path_factory):
    "render_all on the grid, with every figure and table captured instead of written."
    figs, tables = {}, {}
    def keep_figure(fig, folder, name, close=True): figs[name] = fig; return []
    def keep_table(df, folder, name, caption): tables[name] = df; return []
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(render, 'save_figure', keep_figure); mp.setattr(render, 'write_table', keep_table)
        render_all(grid(), tmp_path_factory.mktemp('grid'), scale='paper')
    yield figs, tables
    plt.close('all')


def _every_panel(fig):
    assert len(fig.axes) == len(FAMILIES)
    return zip(FAMILIES, fig.axes)


def test_fig2_shows_the_pure_42k_models(drawn):
    for fam, ax in _every_panel(drawn[0]['fig2_mlm_vs_clm']):
        assert bars(ax) == sorted(f'{s}-{o}-42k' for s in SIZES for o in ('clm', 'mlm40')), fam


def test_fig3_one_line_per_size_through_its_four_42k_mlm_models(drawn):
    for fam, ax in _every_panel(drawn[0]['fig3_mask_ratio']):
        got = sorted(tuple(v) for v in lines(ax).values())
        assert got == sorted(tuple(sorted(f'{s}-mlm{r}-42k' for r in RATIOS)) for s in SIZES), fam
        assert '610m-mlm40-12k' not in str(got) and '610m-mlm40-22k' not in str(got)


def test_fig4_both_variants_follow_the_610m_trajectories(drawn):
    for name in ('fig4_data_efficiency', 'fig4b_data_efficiency_flops'):
        for fam, ax in _every_panel(drawn[0][name]):
            assert lines(ax) == {k.upper(): sorted([f'610m-{o}-42k'] + [f'610m-{o}-42k-{s}' for s in E3_STEPS])
                                 for k, o in (('clm', 'clm'), ('mlm', 'mlm40'))}, (name, fam)
    ax = drawn[0]['fig4b_data_efficiency_flops'].axes[0]
    mlm = next(l for l in ax.lines if l.get_label() == 'MLM')
    assert np.allclose(mlm.get_xdata(), [s * paper_flops_per_step('610m', 'mlm') for s in list(E3_STEPS) + [42000]])


def test_fig5_curves_of_the_pure_42k_models_without_qed(drawn):
    for fam, ax in _every_panel(drawn[0]['fig5_lr_stability']):
        got = sorted(n for v in lines(ax).values() for n in v)
        assert got == sorted(f'{s}-{o}-42k' for s in SIZES for o in ('clm', 'mlm40')), fam   # QA: qed would shift it


def test_fig6_budget_lines_hold_the_e5_models_only(drawn):
    e5 = {f'{b // 1000}k steps': sorted([f'610m-mlm40-{b // 1000}k', f'610m-clm-{b // 1000}k']
                                        + [f'610m-clm-{c // 1000}k-mlm40-{b // 1000}k' for c in cs])
          for b, cs in BUDGETS.items()}
    for fam, ax in _every_panel(drawn[0]['fig6_biphasic']):
        assert lines(ax) == e5, fam              # no E6 run at 95% CLM, no 1B split in the 610m 42k line


def test_fig7_series(drawn):
    for fam, ax in _every_panel(drawn[0]['fig7_ratio_after_clm']):
        assert lines(ax) == {'CLM then MLM': sorted(paper_experiments()['E6']),
                             'MLM only': sorted(f'610m-mlm{r}-42k' for r in RATIOS)}, fam


def test_fig8_and_appendix_figure(drawn):
    for fam, ax in _every_panel(drawn[0]['fig8_cpt']):
        assert lines(ax) == {label: sorted([f'610m-{o}-42k'] + [f'610m-{o}-dec42k-mlm40-{k}k' for k in (44, 54, 64)])
                             for label, o in (('from CLM', 'clm'), ('from MLM-40', 'mlm40'))}, fam
    for fam, ax in _every_panel(drawn[0]['figA1_biphasic_largest']):
        assert bars(ax) == ['1b-clm-10k-mlm40-42k', '1b-clm-42k', '1b-mlm40-42k'], fam


def _table_rows(tables, first: int, title: str) -> list[list[str]]:
    return [sorted(tables[f'T{first + i:02d}_{fam}_{title}'].checkpoint) for i, fam in enumerate(FAMILIES)]


def test_tables_hold_the_right_models(drawn):
    tables = drawn[1]
    pure = sorted(paper_experiments()['E1'])
    assert len(pure) == 15 and _table_rows(tables, 2, 'pure_models') == [pure] * 4
    e3 = sorted(paper_experiments()['E3'])
    assert _table_rows(tables, 6, 'data_efficiency') == [e3] * 4
    e5 = sorted(paper_experiments()['E5'] + ['1b-clm-10k-mlm40-42k'])   # Figure 6's models; none of E6
    assert _table_rows(tables, 10, 'biphasic') == [sorted(n for n in e5 if n.startswith('610m'))] * 4
    assert _table_rows(tables, 14, 'continued_pretraining') == [sorted(n for n in paper_experiments()['E7'] if 'dec' in n)] * 4
    qa = tables['T04_QA_pure_models']
    assert 'qed' not in qa.columns and set(PAPER_DATASETS['QA']) <= set(qa.columns)
    row = qa.set_index('checkpoint').loc['610m-mlm40-42k', 'QA mean']
    assert row.startswith(f"{_score(CHECKPOINTS.index('610m-mlm40-42k'), 2):.2f}")


def test_study_scores_ignore_datasets_outside_the_paper():
    res = grid(['610m-mlm40-42k'])
    qa = study_scores(res).set_index('family').loc['QA']
    assert np.isclose(qa.score, _score(0, 2)) and qa.n_datasets == 3
    assert np.isclose(study_scores(res.drop(columns='in_paper')).set_index('family').loc['QA'].score, _score(0, 2))


def test_per_seed_selection_is_the_default_of_figures():
    # seed 0 prefers LR 1e-5 on validation, seed 1 prefers 1e-4; the seed-mean prefers 1e-4
    rows = [dict(checkpoint_name='610m-mlm40-42k', dataset='sst2', family='SC', lr=lr, seed=s, val_score=v, test_score=t)
            for lr, s, v, t in [(1e-5, 0, .6, .30), (1e-4, 0, .5, .20), (1e-5, 1, .1, .10), (1e-4, 1, .9, .80)]]
    res = pd.DataFrame(rows)
    assert np.isclose(study_scores(res).score.item(), 55.0)
    assert np.isclose(study_scores(res, 'mean').score.item(), 50.0)
    import inspect
    assert inspect.signature(render_all).parameters['selection'].default == 'per_seed'


def test_command_line_draws_the_flops_variant(tmp_path):
    e3 = paper_experiments()['E3']
    csv = tmp_path/'results.csv'
    csv.write_text(tidy_results(grid(e3, qed=False)).to_csv(index=False))
    main(['--results', str(csv), '--out', str(tmp_path/'out'), '--scale', 'paper'])
    for ext in ('png', 'pdf'):
        assert (tmp_path/'out'/f'fig4b_data_efficiency_flops.{ext}').stat().st_size > 1000


CELLS = [(a, p) for a in ('bidirectional', 'causal') for p in ('mean', 'last', 'first')]


def protocol_grid() -> pd.DataFrame:
    "The protocol ablation's rows: CLM at 60 + cell index + family/10 points, MLM 5 + 2 x cell index + family points above."
    rows = []
    for c, (attention, pooling) in enumerate(CELLS):
        for f, fam in enumerate(FAMILIES):
            clm = 60 + c + f / 10
            for ck, score in (('610m-clm-42k', clm), ('610m-mlm40-42k', clm + 5 + 2 * c + f)):
                for d, ds in enumerate(PAPER_DATASETS[fam]):
                    for seed, s_off in enumerate((-0.3, 0.0, 0.3)):
                        rows.append(dict(checkpoint_name=ck, dataset=ds, family=fam, lr=1e-4, seed=seed, val_score=.5,
                                         test_score=(score + (d - 1) * 0.5 + s_off + 0.1 * seed * (ck == '610m-clm-42k')) / 100,
                                         attention=attention, pooling=pooling))
    return pd.DataFrame(rows)


def test_protocol_figure_shows_the_gap_per_cell_and_paper_figures_only_the_papers_cell(tmp_path):
    figs, tables = {}, {}
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(render, 'save_figure', lambda fig, folder, name, close=True: figs.__setitem__(name, fig) or [])
        mp.setattr(render, 'write_table', lambda df, folder, name, caption: tables.__setitem__(name, df) or [])
        render_all(protocol_grid(), tmp_path, scale='paper')
    gaps = tables['protocol_gap']
    assert [tuple(r) for r in gaps[gaps.family == 'SC'][['attention', 'pooling']].values] == CELLS
    for f, fam in enumerate(FAMILIES):
        g = gaps[gaps.family == fam]
        # the CLM seeds carry an extra 0, .1, .2 points (mean .1): the known gap is 5 + 2c + f - 0.1
        assert np.allclose(g.gap, [5 + 2 * c + f - 0.1 for c in range(6)]), fam
        assert (g.ci_low < g.gap).all() and (g.gap < g.ci_high).all()
        heights = [b.get_height() for cont in figs['figP_protocol_gap'].axes[f].containers
                   if isinstance(cont, BarContainer) for b in cont]
        assert np.allclose(heights, g.gap)
    # Figure 2 draws the paper's cell (bidirectional, mean) only: CLM 60.1 + f/10, MLM 65 + f + f/10
    for f, ax in enumerate(figs['fig2_mlm_vs_clm'].axes):
        got = sorted(round(b.get_height(), 6) for c in ax.containers if isinstance(c, BarContainer) for b in c if not np.isnan(b.get_height()))
        assert np.allclose(got, [60 + f / 10 + 0.1, 65 + f / 10 + f]), f
    plt.close('all')


def test_precision_cells_survive_the_tidy_table_and_stay_out_of_the_papers_figures(tmp_path):
    "The precision ablation's rows (pooling cells 0-2 of `protocol_grid`, relabelled auto / pure_bf16 / amp_bf16), read back from a tidy CSV."
    rows = protocol_grid().query("attention == 'bidirectional'").copy()
    rows['precision'] = rows.pooling.map(dict(mean='auto', last='pure_bf16', first='amp_bf16'))
    rows['pooling'], rows['best_step'], rows['steps'] = 'mean', None, 100
    csv = tmp_path/'results.csv'
    csv.write_text(tidy_results(rows).to_csv(index=False))
    figs, tables = {}, {}
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(render, 'save_figure', lambda fig, folder, name, close=True: figs.__setitem__(name, fig) or [])
        mp.setattr(render, 'write_table', lambda df, folder, name, caption: tables.__setitem__(name, df) or [])
        render_all(read_results(csv), tmp_path, scale='paper')
    gaps = tables['protocol_gap']
    assert gaps[gaps.family == 'SC'].precision.tolist() == ['auto', 'pure_bf16', 'amp_bf16']
    for f, fam in enumerate(FAMILIES):
        assert np.allclose(gaps[gaps.family == fam].gap, [5 + 2 * c + f - 0.1 for c in range(3)]), fam
    for f, ax in enumerate(figs['fig2_mlm_vs_clm'].axes):   # the paper's cell (auto) only
        got = sorted(round(b.get_height(), 6) for c in ax.containers if isinstance(c, BarContainer) for b in c if not np.isnan(b.get_height()))
        assert np.allclose(got, [60 + f / 10 + 0.1, 65 + f / 10 + f]), f
    plt.close('all')


def test_protocol_gaps_compare_every_cell_over_the_datasets_all_cells_hold():
    "The paper's cell on 12 datasets and an ablation on one per family: the gaps are taken over those 4 in every cell."
    rows = protocol_grid().query("attention == 'bidirectional' and pooling != 'first'").copy()
    rows['precision'], rows['pooling'] = rows.pooling.map(dict(mean='auto', last='amp_bf16')), 'mean'
    firsts = [ds[0] for ds in PAPER_DATASETS.values()]
    rows = rows[(rows.precision == 'auto') | rows.dataset.isin(firsts)].copy()
    others = (rows.precision == 'auto') & ~rows.dataset.isin(firsts) & (rows.checkpoint_name == '610m-mlm40-42k')
    rows.loc[others, 'test_score'] += 0.03      # MLM 3 points better on the datasets only the paper's cell holds
    gaps = protocol_gaps(rows)
    for f, fam in enumerate(FAMILIES):
        g = gaps[gaps.family == fam]
        assert g.precision.tolist() == ['auto', 'amp_bf16'] and g.n_datasets.tolist() == [1, 1]
        assert np.allclose(g.gap, [5 + 2 * c + f - 0.1 for c in range(2)]), fam   # without the 3 points
    plt.close('all')


def test_a_store_of_the_precision_ablation_alone_renders(tmp_path):
    "No row in the paper's cell: every figure still renders (the paper's numbers only), the protocol figure names the precisions."
    rows = protocol_grid().query("attention == 'bidirectional' and pooling != 'mean'").copy()
    rows['precision'], rows['pooling'] = rows.pooling.map(dict(last='pure_bf16', first='amp_bf16')), 'mean'
    figs = {}
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(render, 'save_figure', lambda fig, folder, name, close=True: figs.__setitem__(name, fig) or [])
        render_all(rows, tmp_path, scale='paper')
    assert {'fig2_mlm_vs_clm', 'fig5_lr_stability', 'figP_protocol_gap'} <= set(figs)
    assert [t.get_text() for t in figs['figP_protocol_gap'].axes[0].get_xticklabels()] == ['pure_bf16', 'amp_bf16']
    plt.close('all')


@pytest.mark.skipif(not (REFERENCE/'results.csv').is_file(), reason='no committed demo results yet')
def test_committed_demo_results_render_every_figure(tmp_path):
    results = read_results(REFERENCE/'results.csv')
    loss = pd.read_csv(REFERENCE/'cpt_loss.csv') if (REFERENCE/'cpt_loss.csv').is_file() else None
    files = render_all(results, tmp_path, 'demo', cpt_loss=loss)
    names_ = {Path(f).name for f in files}
    carried = [n for n, f in FIGURES.items() if f.demo]             # the registry says which figures the demo carries
    drawn = [n for n, f in FIGURES.items() if f.needs in (None, 'flops_per_step')]   # and which these inputs draw
    assert sorted(Path(n).stem for n in names_ if n.endswith('.png')) == sorted(drawn) and set(carried) <= set(drawn)
    for n in carried:
        assert f'{n}.png' in names_ and f'{n}.pdf' in names_
    assert len([n for n in names_ if n.startswith('T') and n.endswith('.tex')]) == 17
    again = render_all(results, tmp_path/'again', 'demo', cpt_loss=loss)
    for a, b in zip(files, again):
        assert Path(a).read_bytes() == Path(b).read_bytes(), a
    # every file these results give is among the committed figures, but a figure the demo does not carry yet
    for f in files:
        if Path(f).parent == tmp_path and Path(f).stem not in carried: continue
        committed = DEMO/Path(f).relative_to(tmp_path)
        assert committed.is_file(), committed


def test_a_demo_study_folder_gives_final_pretraining_losses_beside_the_unigram_entropy(tmp_path, monkeypatch):
    study = tmp_path/'study'
    (study/'tiny-clm-42k').mkdir(parents=True)
    (study/'tiny-clm-42k'/'metrics.jsonl').write_text(''.join(
        f'{{"step": {s}, "phase": 0, "objective": "clm", "mask_ratio": null, "loss": {9 - s / 10}}}\n' for s in range(1, 11)))
    (study/'tiny-clm-42k'/'run.json').write_text('{"config": {"data": "embedded"}}')   # the entropy of what it read
    monkeypatch.setattr(render, 'render_all', lambda *a, **k: [])   # the figures are tested above
    main(['--results', str(REFERENCE/'results.csv'), '--out', str(tmp_path/'f'), '--study', str(study), '--scale', 'demo'])
    pl = pd.read_csv(tmp_path/'f'/'pretrain_loss.csv')
    assert pl[['run', 'last_phase', 'steps']].values.tolist() == [['tiny-clm-42k', 'clm', 10]]
    assert abs(pl.final_loss[0] - 8.2) < 1e-4                      # mean of the last 5 logged losses (8.4 .. 8.0)
    assert 6.5 < pl.unigram_entropy[0] < 7.2                        # the embedded corpus under its 8,192-token BPE


def _control_margins(results: pd.DataFrame) -> pd.DataFrame:
    "Per family: the control's score and seed spread, and the best pretrained model's score and seed spread (percent)."
    from mlmclm.results.aggregation import seed_family_scores
    per_seed = seed_family_scores(results, 'per_seed')
    per_seed = per_seed[~per_seed.checkpoint.str.fullmatch(r'tiny-.*-\d+k-\d+')]   # final models and the control only
    g = per_seed.groupby(['family', 'checkpoint']).test_score.agg(['mean', lambda s: s.max() - s.min()]) * 100
    g.columns = ['score', 'spread']
    rows = []
    for fam, f in g.groupby(level='family'):
        f = f.droplevel('family')
        ctl, best = f.loc['tiny-random'], f.drop('tiny-random').score.idxmax()
        rows.append(dict(family=fam, control=ctl.score, control_spread=ctl.spread, best=best,
                         best_score=f.loc[best, 'score'], best_spread=f.loc[best, 'spread']))
    return pd.DataFrame(rows)


HAS_CONTROL = (REFERENCE/'results.csv').is_file() and 'tiny-random' in set(pd.read_csv(REFERENCE/'results.csv').checkpoint_name)


@pytest.mark.skipif(not HAS_CONTROL, reason='the committed demo results have no control rows yet')
@pytest.mark.parametrize('family', ['TC', 'QA', 'IR'])
def test_the_committed_demo_best_pretrained_model_beats_the_control_by_more_than_the_seed_spread(family):
    m = _control_margins(read_results(REFERENCE/'results.csv')).set_index('family')
    r = m.loc[family]
    assert r.best_score - r.control > max(r.control_spread, r.best_spread), m


@pytest.mark.skipif(not HAS_CONTROL, reason='the committed demo results have no control rows yet')
@pytest.mark.xfail(strict=True, reason='issue 14, measured: at demo scale no pretraining tried (the demo mix, or 504 '
                   'CLM steps on the reviews alone) gives a tiny model sentiment features that a random one does not '
                   'learn from the task itself; SC stays near 55-60% for both. A pass means the demo now does: '
                   'remove this mark and update the README')
def test_the_committed_demo_sc_beats_the_control_and_reaches_60_percent():
    r = _control_margins(read_results(REFERENCE/'results.csv')).set_index('family').loc['SC']
    assert r.best_score >= 60 and r.best_score - r.control > max(r.control_spread, r.best_spread), r


def _committed(path: str) -> bytes | None:
    "The bytes of `path` (relative to the project) as committed at HEAD; None outside a git checkout or if not committed."
    try: r = subprocess.run(['git', 'show', f'HEAD:{path}'], cwd=project_root(), capture_output=True, timeout=60)
    except (OSError, subprocess.SubprocessError): return None
    return r.stdout if r.returncode == 0 else None


@pytest.mark.parametrize('name', REFERENCE_TABLES)
def test_the_reference_tables_are_the_committed_demo_tables(name):
    "The copy the tests read is the demo table committed beside the figures (git's HEAD, not the working tree a rerun rewrote)."
    committed = _committed(f'figures/demo/{name}')
    if committed is None: pytest.skip('not a git checkout, or no committed demo table')
    assert (REFERENCE/name).read_bytes() == committed, (
        f'tests/fixtures/demo/{name} differs from the committed figures/demo/{name}: after committing a demo run, '
        f'`cp figures/demo/{{results,cpt_loss,pretrain_loss}}.csv tests/fixtures/demo/` and commit the copy too')


def test_no_committed_results_test_reads_what_the_demo_writes():
    "The demo rewrites figures/demo/*.csv; a test reading them would fail after `bash .ci/demo` (issue 28)."
    for test in Path(__file__).parent.glob('test_*.py'):
        text = test.read_text(encoding='utf-8')
        for name in REFERENCE_TABLES:
            assert f"DEMO/'{name}'" not in text and f"'figures'/'demo'/'{name}'" not in text, (test.name, name)


def test_the_unigram_entropy_is_that_of_the_one_source_a_study_read(tmp_path):
    from mlmclm.report.render import _study_data
    for run, data in (('a', 'embedded'), ('b', 'embedded+reviews')):
        (tmp_path/run).mkdir(); (tmp_path/run/'run.json').write_text(json.dumps({'config': {'data': data}}))
    with pytest.raises(ValueError, match="expected one source"): _study_data(tmp_path)
    (tmp_path/'a'/'run.json').write_text(json.dumps({'config': {'data': 'embedded+reviews'}}))
    assert _study_data(tmp_path) == 'embedded+reviews'


# ---- what a reader sees: markers, intervals, labels (issue 28)

@pytest.fixture(scope='module')
def demo_drawn():
    "render_all on the committed demo results (the control included), every figure captured instead of written."
    figs = {}
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(render, 'save_figure', lambda fig, folder, name, close=True: figs.__setitem__(name, fig) or [])
        mp.setattr(render, 'write_table', lambda *a, **k: [])
        render_all(read_results(REFERENCE/'results.csv'), DEMO/'unused', 'demo', cpt_loss=pd.read_csv(REFERENCE/'cpt_loss.csv'))
    yield figs
    plt.close('all')


def _paper_markers(ax) -> dict:
    "label -> (marker path vertices, edge colour) of the paper's hollow markers on `ax`."
    return {c.get_label(): (c.get_paths()[0].vertices.round(3).tobytes(), tuple(np.round(c.get_edgecolor()[0], 3)))
            for c in ax.collections if c.get_label().startswith('paper')}


@pytest.mark.parametrize('name', ['fig2_mlm_vs_clm', 'fig4_data_efficiency', 'fig8_cpt'])
def test_the_papers_mlm_and_clm_numbers_have_their_own_marker(drawn, name):
    for fam, ax in _every_panel(drawn[0][name]):
        got = _paper_markers(ax)
        assert len(got) == 2, (name, fam, sorted(got))               # one entry per kind, not one 'paper (reported)'
        (shape_a, colour_a), (shape_b, colour_b) = got.values()
        assert shape_a != shape_b and colour_a != colour_b, (name, fam)


def _drawn_y(ax) -> np.ndarray:
    "Every y value an interval or band on `ax` reaches: filled bands, error bars, spans (data coordinates)."
    ys = [p.vertices[:, 1] for c in ax.collections if isinstance(c, PolyCollection) for p in c.get_paths()]
    ys += [np.asarray(seg).reshape(-1, 2)[:, 1] for c in ax.collections if isinstance(c, LineCollection) for seg in c.get_segments()]
    ys += [p.get_patch_transform().transform(p.get_path().vertices)[:, 1] for p in ax.patches]
    y = np.concatenate([y for y in ys if len(y)]) if ys else np.array([])
    return y[~np.isnan(y)]                                            # sizes with no model of ours are NaN bars


def test_no_drawn_interval_leaves_0_to_100_percent(demo_drawn):
    "The committed demo has intervals past 0 (QA of MLM-40: 0.6 +- 1.8; the control's QA: 11.7 +- 23.8)."
    checked = 0
    for name, fig in demo_drawn.items():
        if fig.axes[0].get_ylabel() != 'score (%)': continue
        for ax in fig.axes:
            y = _drawn_y(ax)
            assert ((y >= -1e-9) & (y <= 100 + 1e-9)).all(), (name, ax.get_title(), y.min(), y.max())
            checked += len(y)
    assert checked > 100


def test_fig6_draws_each_points_interval_as_an_error_bar(drawn):
    for fam, ax in _every_panel(drawn[0]['fig6_biphasic']):
        bars_ = [c for c in ax.collections if isinstance(c, LineCollection)]
        assert len(bars_) == 3, fam                                   # one per budget
        for c, line in zip(bars_, [l for l in ax.lines if not l.get_label().startswith('_')]):
            segs = c.get_segments()
            assert len(segs) == len(line.get_ydata())
            assert all(s[0, 1] < y < s[1, 1] for s, y in zip(segs, line.get_ydata())), fam


def test_fig4_says_so_where_no_intermediate_checkpoint_was_fine_tuned():
    "The demo fine-tunes intermediate checkpoints on TC and QA only: SC and IR say so instead of an empty trajectory."
    res = grid(paper_experiments()['E3'], qed=False)
    res = res[~(res.checkpoint_name.str.contains(r'-42k-\d+$') & res.family.isin(['SC', 'IR']))]
    setup = study_scores(res)
    fig = figures.fig_data_efficiency(setup, reported_scores(), 'demo')
    notes = {ax.get_title(): any('no intermediate checkpoints' in t.get_text() for t in ax.texts) for ax in fig.axes}
    assert notes == {'SC': True, 'TC': False, 'QA': False, 'IR': True}
    plt.close(fig)


def test_fig9_counts_paper_steps_and_names_curves_as_fig8_does(demo_drawn):
    ax = demo_drawn['fig9_cpt_loss'].axes[0]
    labels = {l.get_label(): l.get_xdata().max() for l in ax.lines}
    fig8 = {l.get_label() for l in demo_drawn['fig8_cpt'].axes[0].lines if not l.get_label().startswith('_')}
    assert set(labels) == fig8 == {'from CLM', 'from MLM-40'}
    assert all(np.isclose(x, 12.0) for x in labels.values()), labels   # 96 demo steps of tiny-*-dec42k-mlm40-54k: 12k
    assert 'paper units' in ax.get_xlabel()


def _overlaps(boxes) -> list:
    return [(a, b) for i, (a, ba) in enumerate(boxes) for b, bb in boxes[i + 1:] if ba.overlaps(bb)]


@pytest.mark.parametrize('which', ['demo', 'grid'])
def test_no_axis_label_or_tick_label_overlaps_another(demo_drawn, drawn, which):
    "Figure 4's per-panel x labels ran into each other, and its FLOPs variant labelled minor ticks on top of each other."
    for name, fig in (demo_drawn if which == 'demo' else drawn[0]).items():
        canvas = FigureCanvasAgg(fig)                                 # a figure another test closed has lost its canvas
        canvas.draw()
        r = canvas.get_renderer()
        labels = [(f'{name} xlabel {i}', ax.xaxis.label.get_window_extent(r)) for i, ax in enumerate(fig.axes)
                  if ax.xaxis.label.get_text()]
        assert not _overlaps(labels), name
        for i, ax in enumerate(fig.axes):
            ticks = [(t.get_text(), t.get_window_extent(r)) for t in ax.get_xticklabels() if t.get_text() and t.get_visible()]
            assert not _overlaps(ticks), (name, i, [t for t, _ in ticks])


def test_the_notebooks_figure_2_is_drawn_large_enough_to_read():
    import base64
    nb = json.loads((project_root()/'nbs'/'report'/'00_figures.ipynb').read_text(encoding='utf-8'))
    draw = next(f.draw.__name__ for f in FIGURES.values() if f.paper == 'Figure 2')   # the cell that draws Figure 2
    pngs = [o for c in nb['cells'] if c['cell_type'] == 'code' and f'{draw}(' in ''.join(c['source'])
            for o in c.get('outputs', []) if 'image/png' in o.get('data', {})]
    assert len(pngs) == 1, len(pngs)
    # the width it is shown at: the inline backend's (a retina image is shown at half its pixels), else the PNG header's
    shown = pngs[0].get('metadata', {}).get('image/png', {}).get('width')
    width = shown or int.from_bytes(base64.b64decode(pngs[0]['data']['image/png'])[16:20], 'big')
    assert width >= 800, width


# ---------------------------------------------------------- issue 39 item 1: your own runs described in their own units
def test_an_own_run_is_described_by_its_recorded_config_in_its_own_steps(tmp_path):
    rows = pd.DataFrame(own_rows() + own_rows(name='tiny-clm0.25-mlm-336-1a2b3c-step-84', step=84))
    meta = checkpoint_meta(rows.checkpoint_name, rows).set_index('checkpoint')
    final, early = meta.loc[OWN], meta.loc['tiny-clm0.25-mlm-336-1a2b3c-step-84']
    assert (final['size'], final.kind, final.units, final.budget, final.clm_steps) == ('tiny', 'biphasic', 'own', 336, 84)
    assert final.clm_share == 0.25 and final.mask_ratio == 0.4 and not final.intermediate   # 25%, not the paper's 10/42
    assert final.condition == 'clm-84-mlm40-336' and final.label == 'tiny-clm-84-mlm40-336'
    assert early.intermediate and early.step == 84 and early.label == 'tiny-clm-84-mlm40-336 @84'
    released = checkpoint_meta(['610m-clm-10k-mlm40-42k']).iloc[0]
    assert released.units == 'paper' and np.isclose(released.clm_share, 10 / 42)
    with pytest.raises(ValueError, match="'mystery' is not a released name"):
        checkpoint_meta(['mystery'], rows)
