"""Importing the authors' published runs: fixture tree -> results store -> paper-scale figures and the comparison."""
import subprocess
import sys
from pathlib import Path

import numpy as np

from mlmclm.core import project_root
from mlmclm.figures import render_all
from mlmclm.results import load_results
from mlmclm.paper_runs import compare_with_paper, import_tree, reported_scores, write_fixture_tree
from mlmclm.vocab import parse_run_name, paper_run_names, run_name
from mlmclm.study import paper_plan


def test_every_released_name_round_trips():
    names = set(paper_run_names(appendix=True)) | {e.name for e in paper_plan().evals}
    assert len(names) >= 50
    for name in names:
        assert run_name(parse_run_name(name)) == name


def test_import_command_and_paper_scale_figures(tmp_path):
    write_fixture_tree(tmp_path/'EncodEval', models=('610m-mlm40-42k', '610m-clm-42k', '610m-clm-10k-mlm40-42k',
                                                     '610m-mlm40-42k-5000', '610m-clm-dec42k-mlm40-54k'))
    store = tmp_path/'results.jsonl'
    out = subprocess.run([sys.executable, '-m', 'mlmclm.paper_runs', 'import', str(tmp_path/'EncodEval'),
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
    assert set(summary.selection) == {'mean', 'per_seed'}
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
