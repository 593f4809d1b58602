"""Importing the authors' published runs: fixture tree -> results store -> paper-scale figures and the comparison;
the authors' own SC runs of the 610m models reproduce the paper's printed scores; the published model list is ours;
which datasets count in a family's mean; an import only adds rows and refuses scores and names it cannot trust."""
import dataclasses
import json
import os
import re
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import mlmclm.results.paper_runs as pr
from mlmclm.base.files import append_jsonl, project_root
from mlmclm.report.render import render_all
from mlmclm.results.store import load_results
from mlmclm.results.paper_runs import compare_with_paper, import_tree, in_paper, paper_rows, reported_scores
from fake_encodeval import write_fixture_tree
from result_rows import row
from mlmclm.results.aggregation import DEFAULT_SELECTION, family_scores
from mlmclm.protocol.paper import paper_checkpoints, paper_run_names
from mlmclm.protocol.run_names import parse_run_name, run_name
from mlmclm.study.plan import paper_plan
from mlmclm import task_data, tasks

ROOT = project_root()


def test_every_released_name_round_trips():
    names = set(paper_run_names(appendix=True)) | {e.name for e in paper_plan().evals}
    assert len(names) >= 50
    for name in names:
        assert run_name(parse_run_name(name)) == name


def test_import_command_and_paper_scale_figures(tmp_path):
    write_fixture_tree(tmp_path/'EncodEval', models=('610m-mlm40-42k', '610m-clm-42k', '610m-clm-10k-mlm40-42k',
                                                     '610m-mlm40-42k-5000', '610m-clm-dec42k-mlm40-54k'))
    store = tmp_path/'results.jsonl'
    out = subprocess.run([sys.executable, '-m', 'mlmclm.results.paper_runs', 'import', str(tmp_path/'EncodEval'),
                          '--results', str(store)], capture_output=True, text=True, cwd=project_root(), timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert '120 imported' in out.stdout and '3 skipped' in out.stdout and 'malformed' in out.stdout
    res = load_results(store)
    assert set(res.source) == {'authors'}
    files = render_all(res, tmp_path/'figures', scale='authors')
    assert (tmp_path/'figures'/'fig2_mlm_vs_clm.png').is_file() and (tmp_path/'figures'/'fig8_cpt.pdf').is_file()
    md = (tmp_path/'figures'/'tables'/'ours_minus_paper.md').read_text()
    assert '610m-mlm40-42k' in md and 'ours_minus_paper' in md
    cells, summary = compare_with_paper(res)
    assert summary.selection.tolist() == ['per_seed (default)', 'mean']
    both = cells.dropna(subset=['ours_mean'])
    assert set(both.checkpoint) >= {'610m-mlm40-42k', '610m-clm-42k'} and len(both) >= 8
    # families the fixture does not have stay empty: nothing is invented
    assert cells.query("checkpoint == '610m-mlm40-42k' and family == 'TC'").ours_mean.isna().all()


def test_reported_numbers_are_keyed_by_released_names():
    rep = reported_scores()
    assert rep.score.between(0, 100).all()
    assert {'pfs'} and len(rep) == 68
    for name in rep.checkpoint.unique():
        assert run_name(parse_run_name(name)) == name


DATA = Path(__file__).parents[1]/'fixtures'


def _data_lines(name: str) -> list[str]:
    return [l for l in (DATA/name).read_text().splitlines() if l.strip() and not l.startswith('#')]


def test_published_model_folders_are_our_checkpoints():
    published = _data_lines('encodeval_checkpoints.txt')
    assert len(published) == len(set(published)) == 50
    assert sorted(published) == sorted(paper_checkpoints())
    stripped = list(dict.fromkeys(re.sub(r'-\d{3,}$', '', n) for n in published))   # intermediate step dropped
    assert len(stripped) == 38 and sorted(stripped) == sorted(paper_run_names())
    assert '1b-clm-10k-mlm40-42k' not in published and '1b-clm-10k-mlm40-42k' in paper_checkpoints(appendix=True)


def _write_published_layout(root: Path) -> int:
    "The authors' SC runs of the two 610m models, written back as results/<model>/SC/<dataset>/lr<lr>_sd<seed>/results.json."
    runs = pd.read_csv(DATA/'encodeval_sc_610m.csv', comment='#', dtype={'lr': str})
    for r in runs.itertuples():
        folder = root/'results'/r.model/r.family/r.dataset/f'lr{r.lr}_sd{r.seed}'
        folder.mkdir(parents=True)
        (folder/'results.json').write_text(json.dumps({'validation': {'score': r.val_score}, 'test': {'score': r.test_score}}))
    return len(runs)


def test_authors_runs_reproduce_the_printed_sc_scores(tmp_path):
    assert DEFAULT_SELECTION == 'per_seed'
    n = _write_published_layout(tmp_path/'EncodEval')
    assert n == 175
    store = tmp_path/'results.jsonl'
    out = subprocess.run([sys.executable, '-m', 'mlmclm.results.paper_runs', 'import', str(tmp_path/'EncodEval'),
                          '--results', str(store)], capture_output=True, text=True, cwd=project_root(), timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert f'{n} imported' in out.stdout and '0 skipped' in out.stdout and 'per_seed (default)' in out.stdout
    sc = family_scores(load_results(store)).set_index('checkpoint').score * 100     # the default selection
    assert sc['610m-mlm40-42k'] == pytest.approx(87.00, abs=0.01)                    # printed: Fig. 2, Tables 2-5
    assert sc['610m-clm-42k'] == pytest.approx(83.58, abs=0.01)
    mean = family_scores(load_results(store), 'mean').set_index('checkpoint').score * 100
    assert abs(mean['610m-mlm40-42k'] - 87.00) > 0.05                               # the seed-mean rule does not


# ---------------------------------------------------------------- which datasets count in a family mean
# Issue 36 item 1: whether a dataset counts in its family's mean comes from the task table only.
def _rows(datasets):
    return pd.DataFrame([dict(checkpoint_name='610m-mlm40-42k', dataset=d, family='SC', lr=1e-4, seed=s, val_score=.5,
                              test_score=score) for d, score in datasets for s in range(3)])


def test_a_new_sc_dataset_joins_the_sc_mean_only_when_the_task_table_says_so(monkeypatch):
    rows = _rows([('sst2', .8), ('my_sc', .2)])
    monkeypatch.setitem(tasks.TASKS, 'my_sc', tasks.Task('my_sc', 'SC', 'sequence', task_data.embedded_sentiment))
    assert family_scores(paper_rows(rows)).score.tolist() == pytest.approx([.8])       # registered, not in_paper
    monkeypatch.setitem(tasks.TASKS, 'my_sc', dataclasses.replace(tasks.TASKS['my_sc'], in_paper=True))
    assert family_scores(paper_rows(rows)).score.tolist() == pytest.approx([.5])       # now it counts
    assert not in_paper('qed') and in_paper('squad') and in_paper('rt_sentiment')       # the importer's flag


# -------------------------------------------------------- issue 17 (data loss, silent wrong answers), items 2, 9 and 10
def test_item2_import_only_adds_rows_and_keeps_the_mode(tmp_path, monkeypatch):
    write_fixture_tree(tmp_path/'E')
    store = tmp_path/'results.jsonl'
    append_jsonl(store, row(ck='ours-before'))
    with open(store, 'a') as fh: fh.write('this line is not JSON\n')
    os.chmod(store, 0o664)
    real, calls = pr.read_result_file, []
    def appender_runs_meanwhile(path):                          # a fine-tuning job appends while the import reads
        calls.append(1)
        if len(calls) == 5: append_jsonl(store, row(ck='ours-during'))
        return real(path)
    monkeypatch.setattr(pr, 'read_result_file', appender_runs_meanwhile)
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')
        pr.import_tree(tmp_path/'E', store, progress=False)
        res = load_results(store)
    assert {'ours-before', 'ours-during'} <= set(res.checkpoint_name)
    assert (res.source == 'authors').sum() == 48
    assert 'this line is not JSON' in store.read_text()        # never deleted for good
    assert store.stat().st_mode & 0o777 == 0o664


def test_item9_empty_import_tree_says_so(tmp_path):
    (tmp_path/'results').mkdir()
    out = subprocess.run([sys.executable, '-m', 'mlmclm.results.paper_runs', 'import', str(tmp_path), '--results',
                          str(tmp_path/'r.jsonl')], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert out.returncode != 0
    assert f'no results.json found under {tmp_path/"results"}' in out.stdout + out.stderr
    assert 'Traceback' not in out.stderr


@pytest.mark.parametrize('test_part, reason', [('{"score": true}', 'true'), ('{"score": "0.7"}', "'0.7'")])
def test_item10_importer_refuses_bool_and_string_scores(tmp_path, test_part, reason):
    run = tmp_path/'results'/'610m-clm-42k'/'SC'/'sst2'/'lr1e-04_sd0'; run.mkdir(parents=True)
    (run/'results.json').write_text(f'{{"validation": {{"score": 0.5}}, "test": {test_part}}}')
    report = pr.import_tree(tmp_path, tmp_path/'r.jsonl', progress=False)
    assert report['imported'] == 0 and len(report['skipped']) == 1
    assert reason in report['skipped'][0]['reason'] and 'sst2' in report['skipped'][0]['path']


def test_item10_importer_refuses_unknown_dataset_names(tmp_path):
    run = tmp_path/'results'/'610m-clm-42k'/'SC'/'SST2'/'lr1e-04_sd0'; run.mkdir(parents=True)
    (run/'results.json').write_text('{"validation": {"score": 0.5}, "test": {"score": 0.5}}')
    report = pr.import_tree(tmp_path, tmp_path/'r.jsonl', progress=False)
    assert report['imported'] == 0
    assert "'SST2'" in report['skipped'][0]['reason'] and 'sst2' in report['skipped'][0]['reason']
