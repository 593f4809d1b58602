"""Issue 39, the newcomer's path: your own runs drawn in their own units, paper-scale figures that say what they lack,
directions judged by size as well as sign, README numbers read from the committed results, and command lines that
answer `--help` and bad settings without a traceback."""
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from mlmclm.base.files import project_root
from mlmclm.report.tables import difference_range, direction_verdict, directions
from mlmclm.results.paper_runs import reported_scores

ROOT = project_root()
SCRIPT = Path(sys.executable).parent/'mlmclm'


def _mlmclm(*args, timeout=120):
    "Run the console script (this tree's code first on the path) and return the finished process."
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    cmd = [str(SCRIPT)] if SCRIPT.is_file() else [sys.executable, '-c', 'import sys; from mlmclm.cli import main; sys.exit(main())']
    return subprocess.run(cmd + list(args), capture_output=True, text=True, cwd=ROOT, env=env, timeout=timeout)


# ---------------------------------------------------------------- item 3: directions by sign and size

def test_a_difference_75_times_the_papers_is_not_as_the_paper():
    assert direction_verdict(-36.06, -38.70, -33.41, -0.48) == 'same sign, 75x larger'
    assert direction_verdict(37.05, 33.09, 41.02, 0.50) == 'same sign, 74x larger'
    assert direction_verdict(-0.9, -1.2, -0.6, -0.48) == 'as the paper'          # 1.9x: within the factor
    assert direction_verdict(4.0, 0.5, 7.5, 0.85) == 'as the paper'              # 4.7x, but the paper's value is inside


def test_directions_keep_intervals_of_a_difference_of_percentages_within_100_points():
    per_seed = pd.DataFrame([dict(checkpoint=ck, family='QA', seed=sd, test_score=v)
                             for ck, vs in (('tiny-clm-42k', (0.05, 0.95, 0.77)), ('tiny-mlm40-42k', (0.0, 0.0, 0.0)))
                             for sd, v in enumerate(vs)])
    row = directions(per_seed, reported_scores(), 'tiny').iloc[0]
    assert row.ci_low == -100.0 and -100 <= row.ci_high <= 100
    assert difference_range(-103.14, 111.11) == (-100.0, 100.0)
    assert np.isnan(difference_range(np.nan, np.nan)[0])


# ---------------------------------------------------------------- item 5: command lines

def test_pretrain_help_exits_0_with_the_usage_on_stdout():
    r = _mlmclm('pretrain', '--help')
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith('usage: mlmclm pretrain demo | run') and 'schedule' in r.stdout


def test_pretrain_without_a_subcommand_still_exits_2_with_the_usage_on_stderr():
    r = _mlmclm('pretrain')
    assert r.returncode == 2 and r.stderr.startswith('usage:') and not r.stdout


def test_pretrain_run_with_a_bad_setting_prints_one_error_line_and_exits_2():
    r = _mlmclm('pretrain', 'run', 'schedule=foo')
    assert r.returncode == 2
    assert 'Traceback' not in r.stderr and r.stderr.startswith("error: schedule='foo'"), r.stderr
    r = _mlmclm('pretrain', 'run', 'total_steps')
    assert r.returncode == 2 and r.stderr.startswith("error: 'total_steps' is not key=value"), r.stderr


def test_bench_help_names_the_smoke_subcommand():
    r = _mlmclm('bench', '--help')
    assert r.returncode == 0 and 'smoke' in r.stdout and 'smoke --help' in r.stdout


# ---------------------------------------------------------------- items 1 and 2: figures of what the store holds

import matplotlib.pyplot as plt
from matplotlib.collections import PathCollection
from matplotlib.container import BarContainer

import mlmclm.report.render as render
from mlmclm.report.figures import checkpoint_meta, fig_cpt_loss
from mlmclm.report.render import collect_cpt_loss, main, render_all
from mlmclm.results.store import read_results
from mlmclm.protocol.paper import FAMILIES, PAPER_DATASETS

DEMO_TASKS = {'SC': 'rt_sentiment', 'TC': 'corpus_names', 'QA': 'corpus_speaker', 'IR': 'corpus_excerpt'}
BIPHASIC = [dict(objective='clm', steps=84, mask_ratio=None), dict(objective='mlm', steps=252, mask_ratio=0.4)]
OWN = 'tiny-clm0.25-mlm-336-1a2b3c-step-336'   # what `recorded_name` gives the README's papermill biphasic run


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close('all')


def own_rows(name=OWN, run_id='tiny-clm0.25-mlm-336-1a2b3c', phases=BIPHASIC, step=336, base=0.40, record=True):
    "A fine-tuned checkpoint of ours as `finetune_sweep` stores it: 3 seeds on each demo task, its pretraining record."
    rows = []
    for f, fam in enumerate(FAMILIES):
        for seed in range(3):
            row = dict(checkpoint_name=name, dataset=DEMO_TASKS[fam], family=fam, lr=1e-3, seed=seed, val_score=0.5,
                       test_score=round(base + 0.05 * f + 0.01 * (seed - 1), 4), best_step=None, steps=None, source='ours')
            if record: row.update(pretrain_run_id=run_id, pretrain_step=step, pretrain_phases=phases, pretrain_init_from=None)
            rows.append(row)
    return rows


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


# ---------------------------------------------------------------- item 5: Figure 9 and Table 1

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


# ---------------------------------------------------------------- item 4: the README's numbers come from the results

import importlib.util
import shutil
import time

_spec = importlib.util.spec_from_file_location('docs', ROOT/'.ci'/'docs.py')
docs = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(docs)
REFERENCE = ROOT/'tests'/'fixtures'/'demo'   # the committed demo tables (never what a demo run writes)


def _page(name: str) -> str:
    "A guide page as committed (generated from its template by `.ci/docs.py readme`)."
    return (ROOT/'nbs'/'guide'/f'{name}.md').read_text(encoding='utf-8')


def test_the_readmes_numbers_are_those_of_the_committed_results():
    readme, demo, measured = (ROOT/'README.md').read_text(encoding='utf-8'), _page('demo'), _page('measurements')
    from mlmclm.report.render import split_control, study_scores
    scores = study_scores(split_control(read_results(REFERENCE/'results.csv'))[0]).set_index(['checkpoint', 'family'])
    clm = scores.loc[('tiny-clm-42k', 'TC')]
    for text in (readme, demo):
        assert f'| CLM | ' in text and f'{clm.score:.1f} ± {(clm.ci_high - clm.ci_low) / 2:.1f}' in text
    loss = pd.read_csv(REFERENCE/'pretrain_loss.csv').set_index('run')
    assert f"CLM reaches {loss.loc['tiny-clm-42k', 'final_loss']:.2f}" in readme             # the verdict's numbers
    assert f"MLM-40 at {loss.loc['tiny-mlm40-42k', 'final_loss']:.2f} nats/token" in readme
    assert f"CLM {loss.loc['tiny-clm-42k', 'final_loss']:.2f} training" in demo
    assert f"MLM-40 {loss.loc['tiny-mlm40-42k', 'final_loss']:.2f};" in measured      # the measured table: 7.09, not 7.10
    timings = json.loads((ROOT/'figures'/'demo'/'timings.json').read_text())
    demo_t, test_t = timings['demo'][0], timings['test'][0]
    assert f"the demo took {demo_t['minutes']:g} minutes at a load of {demo_t['load'][0]:g} to {demo_t['load'][1]:g}" in readme
    assert f"the tests {test_t['minutes']:g} minutes" in readme
    assert all(f"{e['minutes']:g} minutes" in demo for e in timings['demo'] + timings['test'])   # every measurement
    assert '20 to 45 minutes' not in readme and '16.5 min:' not in readme
    inter = read_results(REFERENCE/'results.csv')
    inter = inter[inter.checkpoint_name.str.fullmatch(r'tiny-.+-\d{3,}')]
    assert 'two intermediate ones on two tasks' in demo and inter.dataset.nunique() == 2
    assert "TC same sign, 75x larger" in demo
    assert f"over {read_results(REFERENCE/'results.csv').seed.nunique()} seeds" in readme


def test_check_readme_fails_when_a_committed_number_changes(tmp_path, monkeypatch, capsys):
    copy = tmp_path/'demo'; shutil.copytree(REFERENCE, copy)
    table = pd.read_csv(copy/'pretrain_loss.csv')
    table.loc[table.run == 'tiny-clm-42k', 'final_loss'] += 0.5
    table.to_csv(copy/'pretrain_loss.csv', index=False)
    monkeypatch.setattr(docs, 'DEMO', copy)
    assert docs.main(['check-readme']) == 1
    out = capsys.readouterr().out
    assert 'README.md is not what nbs/index.ipynb renders to' in out
    assert 'nbs/guide/demo.md is not what demo.md.in renders to' in out   # the guide page that carries the losses too
    monkeypatch.setattr(docs, 'DEMO', REFERENCE)
    assert docs.main(['check-readme']) == 0


def test_an_unknown_number_in_the_readme_is_an_error_naming_it():
    with pytest.raises(KeyError, match=r"\{\{nonsense\}\} in nbs/index.ipynb: no such number"):
        docs.fill('took {{nonsense}} minutes')
    newest = json.loads((ROOT/'figures'/'demo'/'timings.json').read_text())['demo'][0]
    assert docs.fill('{{timing demo}}') == f"{newest['minutes']:g} minutes at a load of {newest['load'][0]:g} to {newest['load'][1]:g}"
    with pytest.raises(KeyError, match=r"\{\{count lrs\}\}: no such count"): docs.fill('{{count lrs}}')


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
    assert 'python3 .ci/timed.py test -- bash .ci/test' in script and 'nbdev_test --n_workers 2 --timing --do_print' in script
    assert 'python3 .ci/timed.py demo -- bash .ci/demo' in (ROOT/'.ci'/'demo').read_text()
    for name in ('a', 'b'):   # what --do_print shows, through a pipe, as each notebook ends
        nb = dict(cells=[dict(cell_type='code', id='c0', metadata={}, execution_count=None, outputs=[], source=['assert 1 + 1 == 2'])],
                  metadata={}, nbformat=4, nbformat_minor=5)
        (tmp_path/f'{name}.ipynb').write_text(json.dumps(nb))
    nbdev_test = Path(sys.executable).parent/'nbdev_test'
    if not nbdev_test.is_file(): pytest.skip('nbdev_test is not installed beside this Python')
    r = subprocess.run([str(nbdev_test), '--path', str(tmp_path), '--n_workers', '2', '--timing', '--do_print'], cwd=ROOT,
                       capture_output=True, text=True, env=dict(os.environ, PYTHONUNBUFFERED='1'), timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.count('- Completed') == 2 and 'a.ipynb: ' in r.stdout


def test_the_developing_pages_jupyterlab_line_starts_as_root_and_as_a_user(tmp_path):
    line = re.search(r'`\.venv/bin/(jupyter lab [^`]*)`', _page('developing')).group(1).split()
    assert line[:2] == ['jupyter', 'lab'] and '--allow-root' in line
    jupyter = Path(sys.executable).parent/'jupyter'
    if not jupyter.is_file(): pytest.skip('JupyterLab is not installed beside this Python')
    args = [str(jupyter)] + line[1:-1] + [str(ROOT/'nbs'), '--no-browser', '--ServerApp.port=0',
                                          f'--ServerApp.root_dir={ROOT}', '--ServerApp.token=x']
    env = dict(os.environ, JUPYTER_RUNTIME_DIR=str(tmp_path/'rt'), JUPYTER_CONFIG_DIR=str(tmp_path/'cfg'), HOME=str(tmp_path))
    p = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=tmp_path)
    seen, deadline = [], time.monotonic() + 90
    try:
        while time.monotonic() < deadline:
            out = p.stdout.readline()
            if not out and p.poll() is not None: break
            seen.append(out)
            if 'is running at' in out or 'http://127.0.0.1:' in out: break
    finally:
        p.terminate()
        try: p.wait(timeout=30)
        except subprocess.TimeoutExpired: p.kill(); p.wait()
    assert any('http://127.0.0.1:' in s or 'is running at' in s for s in seen), ''.join(seen)[-2000:]


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
