"""Issue 17 (data loss and silent wrong answers), the items of the results store: one test per item, each written to
fail on the code before the fix. Named after the item they reproduce."""
import json
import math
import os
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

import mlmclm.finetuning.loop as ft

import mlmclm.finetuning.sweep as sw
from mlmclm.protocol.runs import FinetuneConfig
import mlmclm.results.paper_runs as pr
from fake_encodeval import write_fixture_tree
from tiny import tiny_cfg, tiny_checkpoint
from mlmclm.base.configs import ConfigError
from mlmclm.base.files import append_jsonl, atomic_write_json, atomic_write_text, project_root, read_jsonl
from mlmclm.results.store import load_results
from mlmclm.results.aggregation import aggregate, family_scores

ROOT = project_root()


pytestmark = pytest.mark.usefixtures('one_thread')   # tiny models: one thread is faster (conftest.py)


def row(ck='m', ds='sst2', lr=1e-4, seed=0, val=.8, test=.7, family='SC', **kw):
    return dict(checkpoint_name=ck, dataset=ds, family=family, lr=lr, seed=seed, val_score=val, test_score=test, **kw)


# ---- 1. a torn line eats the next good row ----
def test_item1_torn_line_does_not_eat_the_next_row(tmp_path):
    f = tmp_path/'rows.jsonl'
    append_jsonl(f, {'a': 1})
    with open(f, 'a') as fh: fh.write('{"a": 2, "lo')          # a writer killed mid-line (or disk full)
    append_jsonl(f, {'a': 3})
    with pytest.warns(UserWarning, match='line 2: not JSON'):    # the torn fragment is a line of its own, named
        assert read_jsonl(f) == [{'a': 1}, {'a': 3}]


def test_item1_finetuning_after_a_store_lost_its_last_newline(tmp_path):
    cfg = tiny_cfg(tmp_path)
    store = Path(cfg.results)
    store.write_text(json.dumps(row()))                         # a complete row, its newline truncated away
    sw.finetune_sweep(cfg)
    res = load_results(store)
    assert sorted(res.dataset) == ['rt_sentiment', 'sst2']


# ---- 2. the importer rewrites the whole store ----
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


# ---- 4. checkpoints of one run share a results name ----
def test_item4_two_checkpoints_of_one_run_are_both_fine_tuned(tmp_path):
    s20 = tiny_checkpoint(tmp_path/'run'/'checkpoints'/'step-20', step=20, seed=1)
    s40 = tiny_checkpoint(tmp_path/'run'/'checkpoints'/'step-40', step=40, seed=2)
    for ck in (s20, s40): sw.finetune_sweep(tiny_cfg(tmp_path, checkpoint=str(ck)))
    res = load_results(tmp_path/'results.jsonl')
    assert len(res) == 2 and res.checkpoint_name.nunique() == 2
    assert sw.recorded_name(tiny_cfg(tmp_path, checkpoint=str(s20))) != sw.recorded_name(tiny_cfg(tmp_path, checkpoint=str(s40)))


# ---- 5. non-finite inputs pass fine-tuning ----
@pytest.mark.parametrize('field, value', [('lrs', 'inf'), ('lrs', 'nan'), ('lrs', '1e-4,Infinity'), ('seeds', '0.7')])
def test_item5_non_finite_or_fractional_sweep_values_are_refused(tmp_path, field, value):
    with pytest.raises(ConfigError, match=f"{field}='{value}'"):
        ft.check_finetune_config(tiny_cfg(tmp_path, **{field: value}))


def test_item5_an_all_nan_checkpoint_does_not_score(tmp_path):
    ck = tiny_checkpoint(tmp_path/'nan', fill=float('nan'))
    with pytest.raises((ConfigError, FloatingPointError), match='not finite'):
        sw.finetune_sweep(tiny_cfg(tmp_path, checkpoint=str(ck)))
    assert load_results(tmp_path/'results.jsonl').empty


# ---- 6. duplicate rows counted as seeds ----
def test_item6_a_run_stored_twice_counts_once(tmp_path):
    store = tmp_path/'results.jsonl'
    for _ in range(2):                                          # two processes on the same checkpoint
        for seed in (0, 1): append_jsonl(store, row(seed=seed, test=.7 + seed / 10))
    res = load_results(store)
    assert aggregate(res).n_seeds.tolist() == [2]
    assert family_scores(res).n_seeds.tolist() == [2]
    doubled = pd.concat([res, res])                             # whatever table is handed in
    assert aggregate(doubled).n_seeds.tolist() == [2]


# ---- 9. clear errors instead of tracebacks ----
def test_item9_garbage_lines_in_a_store_are_skipped_with_file_and_line(tmp_path):
    store = tmp_path/'results.jsonl'
    append_jsonl(store, row(seed=0))
    with open(store, 'a') as fh:
        fh.write('42\n[1, 2]\n{"checkpoint_name": "m"}\n{"checkpoint_name": "m", "dataset": "sst2", "lr": "fast", "seed": 0}\n')
    append_jsonl(store, row(seed=1))
    with pytest.warns(UserWarning, match=r'results\.jsonl.*line 2') as w:
        res = load_results(store)
    assert sorted(res.seed) == [0, 1]
    assert 'line 5' in ' '.join(str(x.message) for x in w)


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


def test_item9_empty_import_tree_says_so(tmp_path):
    (tmp_path/'results').mkdir()
    out = subprocess.run([sys.executable, '-m', 'mlmclm.results.paper_runs', 'import', str(tmp_path), '--results',
                          str(tmp_path/'r.jsonl')], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert out.returncode != 0
    assert f'no results.json found under {tmp_path/"results"}' in out.stdout + out.stderr
    assert 'Traceback' not in out.stderr


# ---- 10. small but real ----
def test_item10_written_files_honour_the_umask(tmp_path):
    old = os.umask(0o022)
    try:
        atomic_write_text(tmp_path/'a.txt', 'x')
        atomic_write_json(tmp_path/'b.json', {})
        append_jsonl(tmp_path/'c.jsonl', {})
    finally: os.umask(old)
    for n in ('a.txt', 'b.json', 'c.jsonl'):
        assert (tmp_path/n).stat().st_mode & 0o777 == 0o644, n


def test_item10_checkpoints_honour_the_umask(tmp_path):
    old = os.umask(0o022)
    try: ck = tiny_checkpoint(tmp_path/'ck')
    finally: os.umask(old)
    assert (ck/'model.safetensors').stat().st_mode & 0o777 == 0o644


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


def test_a_csv_results_path_is_refused_before_anything_is_written(tmp_path):
    "Issue 14: a results path ending in .csv used to receive JSON lines; it is refused, and nothing lands on disk."
    from mlmclm.base.configs import build_config
    from mlmclm.results.store import StoreWriter
    for path in (tmp_path/'r.csv', tmp_path/'sub'/'results.csv'):
        cfg = build_config(FinetuneConfig, results=str(path), tasks='rt_sentiment', max_steps=1, progress=False)
        with pytest.raises(ConfigError, match=r"names a CSV table; a results store is JSON lines: give a path ending in \.jsonl"):
            sw.finetune_sweep(cfg)
        with pytest.raises(ConfigError, match='names a CSV table'):
            StoreWriter(path)
    assert list(tmp_path.iterdir()) == []


def test_item5_a_fine_tuning_run_whose_loss_is_not_finite_stops_and_stores_nothing(tmp_path, monkeypatch):
    ck = tiny_checkpoint(tmp_path/'ck')
    monkeypatch.setattr(ft, 'batch_backward', lambda *a, **k: torch.tensor(float('nan')))   # a diverged step
    with pytest.raises(FloatingPointError, match='fine-tuning loss is nan at step 1 of 1'):
        sw.finetune_sweep(tiny_cfg(tmp_path, checkpoint=str(ck)))
    assert load_results(tmp_path/'results.jsonl').empty
