"""Third fault attack (issue 34), the store's part: sources and settings kept apart by every aggregation (N1, N4,
N22), sweeps that refuse rows of other settings (N4), exact learning-rate keys (N23), names that stay text (N21),
store paths that must exist (N24) and must not be another store's scores file (N6), and shared files read only
through `core.read_shared`: a FIFO, a link to /dev/zero or a huge file among the shards or claims never hangs or eats
a reader (N7, N8, N15). Case numbers are those of ../shared/faults/attack-3.md."""
import ast
import dataclasses
import os
import threading
import time
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import mlmclm
import mlmclm.finetuning.loop as ft

import mlmclm.finetuning.sweep as sw
import mlmclm.results.store as res
import mlmclm.results.compaction as comp
import mlmclm.results.aggregation as aggr
from mlmclm import core
from mlmclm.base.configs import ConfigError, build_config, notebook_config
from mlmclm.base.files import UnreadableFile, read_shared
from mlmclm.base.claims import try_claim
from mlmclm.protocol.runs import (FinetuneConfig, FinetuneRun, PretrainConfig, row_cell, run_key, sweep_settings,
                                  work_claim_path)

BASE = dict(checkpoint_name='610m-clm-42k', dataset='sst2', family='SC', lr=1e-5, best_step=None, steps=1)


def _write(store, rows):
    with res.StoreWriter(store) as w: w.append(rows)


def _finishes(f, timeout=20.0):
    "f()'s value, or a failure when it has not returned within `timeout` seconds (a reader blocked on a FIFO)."
    out = {}
    def call():
        try: out['v'] = f()
        except BaseException as e: out['e'] = e
    t = threading.Thread(target=call, daemon=True)
    t.start(); t.join(timeout)
    assert not t.is_alive(), f'{f} still blocked after {timeout} s'
    if 'e' in out: raise out['e']
    return out.get('v')


# N1: our rows and the authors' rows of one model, written in either order -------------------------------------------
@pytest.mark.parametrize('authors_first', [True, False])
def test_sources_stay_apart_in_every_aggregation(tmp_path, authors_first):
    store = tmp_path/'results.jsonl'
    ours = [dict(BASE, seed=k, val_score=.9, test_score=.9, source='ours') for k in range(3)]
    theirs = [dict(BASE, seed=k, val_score=.1, test_score=.1, source='authors') for k in range(5)]
    for rows in ((theirs, ours) if authors_first else (ours, theirs)): _write(store, rows)
    df = res.load_results(store)
    fam = aggr.family_scores(df).set_index('source')
    assert fam.loc['ours', 'score'] == pytest.approx(.9) and fam.loc['ours', 'n_seeds'] == 3
    assert fam.loc['authors', 'score'] == pytest.approx(.1) and fam.loc['authors', 'n_seeds'] == 5
    agg = aggr.aggregate(df).set_index('source')
    assert agg.n_seeds.to_dict() == {'authors': 5, 'ours': 3}
    tidy = res.tidy_results(df)
    assert len(tidy) == 8 and sorted(tidy.source) == ['authors'] * 5 + ['ours'] * 3
    assert len(res.unique_runs(df)) == 8
    assert sorted(aggr.select_lr(df, 'mean').groupby('source').size().items()) == [('authors', 5), ('ours', 3)]
    curve = aggr.lr_curve(df).set_index('source').score
    assert curve.to_dict() == pytest.approx({'authors': .1, 'ours': .9})
    assert set(aggr.lr_sensitivity(df).source) == {'authors', 'ours'}
    # the tidy table read back (what figures read) keeps them apart too
    tidy.to_csv(tmp_path/'results.csv', index=False)
    back = aggr.family_scores(res.read_results(tmp_path/'results.csv')).set_index('source')
    assert back.n_seeds.to_dict() == {'authors': 5, 'ours': 3}


# N4: a sweep under other settings never reuses rows; aggregations never mix them ----------------------------------
def _sweep(store, **kw) -> FinetuneConfig:
    return build_config(FinetuneConfig, dict(tasks='rt_sentiment', lrs='1e-3', seeds='0', max_steps=1, eval_every=1,
                                             batch_size=4, micro_batch_size=4, max_eval_examples=4, results=str(store),
                                             progress=False), **kw)


def test_sweep_with_other_settings_is_refused_naming_them(tmp_path):
    store = tmp_path/'r.jsonl'
    cfg = _sweep(store)
    sw.finetune_sweep(cfg)
    (row,) = res.read_rows(store)
    assert (row['max_steps'], row['batch_size'], row['max_eval_examples'], row['special_tokens']) == (1, 4, 4, 'eos')
    sw.finetune_sweep(cfg)                                          # the same settings: done, nothing trained
    assert len(res.read_rows(store)) == 1
    other = dataclasses.replace(cfg, special_tokens='bos_eos', select_step='best', warmup='round', max_steps=30,
                                batch_size=8, micro_batch_size=8)
    with pytest.raises(ConfigError) as e: sw.finetune_sweep(other)
    msg = str(e.value)
    for said in ("select_step 'final' (asked 'best')", "special_tokens 'eos' (asked 'bos_eos')", "warmup 'ceil' (asked 'round')",
                 'max_steps 1 (asked 30)', 'batch_size 4 (asked 8)', "force='<reason>'"):
        assert said in msg, (said, msg)
    assert len(res.read_rows(store)) == 1                           # refused before anything ran
    for kw in (dict(max_length=64), dict(packing=False), dict(max_eval_examples=2), dict(data_source='canonical'),
               dict(tc_mode='seqeval'), dict(qa_mode='squad'), dict(ndcg_mode='standard')):
        with pytest.raises(ConfigError, match=f'{next(iter(kw))} '): sw.finetune_sweep(dataclasses.replace(cfg, **kw))
    sw.finetune_sweep(dataclasses.replace(cfg, max_steps=2), force='two steps')   # a deliberate re-run supersedes
    (now,) = res.load_results(store).to_dict('records')
    assert (now['max_steps'], now['steps'], now['supersedes']) == (2, 2, 'two steps')


def test_rows_of_other_settings_never_merge_in_aggregations():
    rows = [dict(BASE, seed=k, val_score=.5, test_score=.5, batch_size=8, max_steps=200, max_length=128) for k in range(3)]
    rows += [dict(BASE, seed=k, val_score=.9, test_score=.9, batch_size=8, max_steps=30, max_length=128) for k in range(3, 5)]
    df = pd.DataFrame(rows)
    fam = aggr.family_scores(df).set_index('cell')
    assert fam.score.to_dict() == pytest.approx({'max_steps=200': .5, 'max_steps=30': .9})
    assert fam.n_seeds.to_dict() == {'max_steps=200': 3, 'max_steps=30': 2}
    assert len(aggr.aggregate(df)) == 2 and len(aggr.lr_curve(df)) == 2
    tidy = res.tidy_results(df)
    assert 'max_steps' in tidy and 'batch_size' not in tidy         # the setting they differ in stays a column
    one = pd.DataFrame(rows[:3])                                    # one cell: the tables as before, cell ''
    assert aggr.family_scores(one).cell.tolist() == [''] and list(res.tidy_results(one).columns) == res.RESULT_COLUMNS


def test_older_rows_get_the_settings_they_ran_with(tmp_path):
    "A store written before the options were recorded stays readable; its rows ran the earlier mlmclm choices."
    store = tmp_path/'old.jsonl'
    core.append_jsonl(store, dict(BASE, seed=0, val_score=.5, test_score=.5))            # before 4b15589
    core.append_jsonl(store, dict(BASE, seed=1, val_score=.5, test_score=.5, select_step='final', special_tokens='eos',
                                  tc_mode='encodeval', qa_mode='encodeval', ndcg_mode='encodeval', warmup='ceil',
                                  data_source='encodeval', precision='fp32', max_length=2028))   # before packing
    old, mid = res.read_rows(store)
    assert (row_cell(old)['select_step'], row_cell(old)['packing'], row_cell(old)['max_steps']) == ('best', False, 'unknown')
    assert (row_cell(mid)['select_step'], row_cell(mid)['precision_used'], row_cell(mid)['packing']) == ('final', 'fp32', False)
    fam = aggr.family_scores(res.load_results(store))
    assert len(fam) == 2 and fam.n_seeds.tolist() == [1, 1]        # the two protocols are not one model's two seeds
    run = FinetuneRun('610m-clm-42k', 'sst2', ('sst2',), 1e-5, 0)
    asked = sweep_settings(FinetuneConfig(), 2028)
    with pytest.raises(ConfigError, match="select_step 'best' \\(asked 'final'\\)"): res.missing(store, [run], asked=asked)
    assert res.missing(store, [run]) == []                          # without settings asked: as before


# N22: precision 'auto' that ran fp32 and pure bf16 -----------------------------------------------------------------
def test_auto_precision_that_ran_differently_is_two_cells():
    rows = [dict(BASE, seed=k, val_score=.5, test_score=.5, precision='auto', precision_used='fp32') for k in range(3)]
    rows += [dict(BASE, seed=k, val_score=.9, test_score=.9, precision='auto', precision_used='pure_bf16') for k in range(3, 5)]
    fam = aggr.family_scores(pd.DataFrame(rows)).set_index('cell')
    assert fam.score.to_dict() == pytest.approx({'precision_used=fp32': .5, 'precision_used=pure_bf16': .9})


# N23: learning rates that share 6 significant digits ---------------------------------------------------------------
def test_close_learning_rates_are_different_runs(tmp_path):
    store = tmp_path/'r.jsonl'
    _write(store, [dict(BASE, seed=0, val_score=.5, test_score=.5, lr=1e-4)])
    runs = [FinetuneRun('610m-clm-42k', 'sst2', ('sst2',), lr, 0) for lr in (1e-4, 1.000001e-4, 1.0000049e-4)]
    assert res.missing(store, runs) == runs[1:]
    assert run_key(dict(BASE, seed=0, lr=1e-4)) == '610m-clm-42k|sst2|0.0001|0'   # keys written before are unchanged


# N21: names stay text --------------------------------------------------------------------------------------------
def test_numeric_looking_names_stay_text():
    from mlmclm.pretraining.loop import command_config
    cfg = command_config(['run_id=007', 'data=0042', 'out_dir=00', 'total_steps=4'])
    assert (cfg.run_id, cfg.data, cfg.out_dir, cfg.total_steps) == ('007', '0042', '00', 4)
    assert command_config(['run_id=1e3']).run_id == '1e3' and command_config(['run_id=1_000']).run_id == '1_000'
    with pytest.raises(ConfigError, match='checkpoint_name=610 came as a number'):
        build_config(FinetuneConfig, checkpoint_name=610)
    ns = dict(In=['# Parameters\ncheckpoint_name = 610\n'], checkpoint_name=610)   # what papermill -p makes of 0610
    with pytest.raises(ConfigError, match='-r checkpoint_name VALUE'): notebook_config(FinetuneConfig, ns)
    assert build_config(FinetuneConfig, lrs=0.001, seeds=0).lrs == '0.001'   # number lists still take numbers


# N24: a store path that does not exist -----------------------------------------------------------------------------
@pytest.mark.parametrize('command', ['health', 'compact'])
def test_health_and_compact_refuse_a_missing_store(tmp_path, capsys, command):
    typo = tmp_path/'typo2'/'dir'/'results.jsonl'
    with pytest.raises(SystemExit) as e: comp.main([command, str(typo)])
    assert e.value.code == 2 and f"results store '{typo}' does not exist" in capsys.readouterr().err
    assert not (tmp_path/'typo2').exists()                          # nothing created
    assert comp.compact(typo) == dict(shards=0, rows=0, rejected=0) and not (tmp_path/'typo2').exists()
    with pytest.raises(ConfigError, match='names a CSV table'): comp.store_health(tmp_path/'results.csv')


# N6: X.jsonl and X.scores.jsonl ------------------------------------------------------------------------------------
def test_a_store_cannot_take_another_stores_scores_file(tmp_path):
    a, b = tmp_path/'exp.jsonl', tmp_path/'exp.scores.jsonl'
    _write(a, [dict(BASE, seed=k, val_score=.5, test_score=.5, test_scores_i=[1., 0., float(k)]) for k in range(3)])
    comp.compact(a)
    with pytest.raises(ConfigError, match='ends in .scores.jsonl, the name of the per-example scores file of the store exp.jsonl'):
        res.StoreWriter(b)
    with pytest.raises(ConfigError, match='ends in .scores.jsonl'): comp.compact(b)
    assert len(res.read_examples(a)) == 3
    # a store of that name written by an earlier release stays readable, and compacting its neighbour is refused
    d = res.shard_dir(b); d.mkdir()
    core.append_jsonl(d/'w.jsonl', {'_writer': {}})                                       # a shard begins with its header
    core.append_jsonl(d/'w.jsonl', dict(BASE, checkpoint_name='other', seed=7, val_score=.5, test_score=.5))
    assert len(res.read_rows(b)) == 1
    with pytest.raises(ConfigError, match='also a results store of its own'): comp.compact(a)
    assert len(res.read_examples(a)) == 3 and len(res.read_rows(b)) == 1


# N7, N8, N15: FIFOs, /dev/zero and huge files among the shards and claims --------------------------------------------
def _store_with_rows(tmp_path) -> Path:
    store = tmp_path/'results.jsonl'
    _write(store, [dict(BASE, seed=k, val_score=.5, test_score=.5) for k in range(2)])
    return store


def test_a_fifo_among_the_shards_blocks_no_reader(tmp_path):
    store = _store_with_rows(tmp_path)
    fifo = res.shard_dir(store)/'zz.jsonl'
    os.mkfifo(fifo)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter('always')
        assert len(_finishes(lambda: res.load_results(store))) == 2
    assert any('zz.jsonl' in str(m.message) and 'a named pipe (FIFO), not a regular file' in str(m.message) for m in w)
    health = _finishes(lambda: comp.store_health(store))
    assert health['unreadable'] == {str(fifo): 1} and health['runs'] == 2
    assert _finishes(lambda: res.missing(store, [FinetuneRun('610m-clm-42k', 'sst2', ('sst2',), 1e-5, 0)], warn=False)) == []
    _finishes(lambda: comp.compact(store, abandoned_after_s=0))
    assert fifo.exists() and len(res.read_rows(store, warn=False)) == 2   # left in place, named; the rows merged


def test_a_shard_linked_to_dev_zero_or_too_large_is_named_not_read(tmp_path):
    store = _store_with_rows(tmp_path)
    d = res.shard_dir(store)
    (d/'zero.jsonl').symlink_to('/dev/zero')
    huge = d/'huge.jsonl'
    with open(huge, 'wb') as f: f.truncate(core.SHARED_MAX_BYTES + 1)   # sparse: nothing is written
    problems = _finishes(lambda: res.scan_store(store))[1]
    assert problems[d/'zero.jsonl'] == ['the whole file: a symbolic link to /dev/zero; a shared file is never read through a link']
    assert 'more than the 4,294,967,296 allowed' in problems[huge][0]
    assert len(res.load_results(store)) == 2


def test_a_fifo_in_place_of_a_claim_blocks_nothing(tmp_path):
    store = _store_with_rows(tmp_path)
    run = FinetuneRun('610m-clm-42k', 'sst2', ('sst2',), 1e-3, 0)
    claim = work_claim_path(store, run.work)
    claim.parent.mkdir(parents=True, exist_ok=True)
    os.mkfifo(claim)
    assert _finishes(lambda: comp.store_health(store))['claims'] == {'running': 1}   # aged by its mtime, as any claim
    assert _finishes(lambda: try_claim(claim, lease_s=60)) is None
    time.sleep(0.05)
    held = _finishes(lambda: try_claim(claim, lease_s=0.01))                     # past its lease: taken over
    assert held is not None and claim.is_file()
    held.release()


def test_read_shared_refuses_what_is_not_a_regular_file(tmp_path):
    os.mkfifo(tmp_path/'p')
    with pytest.raises(UnreadableFile, match='a named pipe'): _finishes(lambda: read_shared(tmp_path/'p'))
    with pytest.raises(UnreadableFile, match='a folder'): read_shared(tmp_path)
    with pytest.raises(FileNotFoundError): read_shared(tmp_path/'missing')
    (tmp_path/'x.json').write_text('{"a": 1}')
    assert core.read_json(tmp_path/'x.json') == {'a': 1}
    with pytest.raises(UnreadableFile, match='more than the 3 allowed'): core.read_json(tmp_path/'x.json', max_bytes=3)


def test_legacy_examples_file_is_named_when_damaged(tmp_path):
    store = _store_with_rows(tmp_path)
    Path(f'{store}.examples.npz').write_bytes(b'not an npz')
    with pytest.raises(ValueError, match=r'results\.jsonl\.examples\.npz cannot be read .*per-example test scores'):
        res.read_examples(store)


# the rule: no other read of a shared file in core, claims, runs, results and compaction ----------------------------
@pytest.mark.parametrize('module', ['base/files', 'base/claims', 'protocol/runs', 'results/store', 'results/compaction'])
def test_shared_files_are_read_only_through_read_shared(module):
    "Every file these modules read comes through `core.read_shared`/`open_shared` (regular files, bounded, never blocking)."
    tree = ast.parse((Path(mlmclm.__file__).parent/f'{module}.py').read_text())
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call): continue
        f = node.func
        name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else None
        if name in ('read_bytes', 'read_text'): found.append((name, node.lineno))
        if name in ('load', 'read_csv') and not (node.args and isinstance(node.args[0], ast.Call) and getattr(node.args[0].func, 'attr', '') == 'BytesIO'):
            found.append((name, node.lineno))
        if name == 'open' and isinstance(f, ast.Name):             # builtin open: only to write, or to fsync our own temp file
            mode = node.args[1].value if len(node.args) > 1 and isinstance(node.args[1], ast.Constant) else 'r'
            if 'r' in mode and ast.unparse(node.args[0]) != 'tmp': found.append(('open', node.lineno))
        if isinstance(f, ast.Attribute) and f.attr == 'open' and ast.unparse(f.value) == 'os':
            flags = ast.unparse(node.args[1]) if len(node.args) > 1 else ''
            if 'O_RDONLY' in flags and 'O_NONBLOCK' not in flags: found.append(('os.open', node.lineno))
    assert not found, f'{module}.py reads files other than through read_shared: {found}'


def test_a_family_never_averages_one_datasets_two_token_limits():
    "The token limit is a task's own by default, so a family's datasets may differ in it; one dataset's two limits may not."
    rows = [dict(BASE, dataset=ds, seed=k, val_score=.5, test_score=.5, batch_size=8, max_steps=200, max_length=n)
            for ds, n in (('sst2', 128), ('mnli', 512)) for k in range(2)]
    assert aggr.family_scores(pd.DataFrame(rows)).n_datasets.tolist() == [2]        # two datasets, two limits: one family
    clash = rows + [dict(BASE, dataset='sst2', seed=k, val_score=.9, test_score=.9, batch_size=8, max_steps=200,
                         max_length=256) for k in range(2)]
    assert len(aggr.aggregate(pd.DataFrame(clash))) == 3                             # per dataset: kept apart
    for table in (aggr.family_scores, aggr.lr_curve):
        with pytest.raises(ConfigError, match='holds rows of sst2 that differ only in max_length'): table(pd.DataFrame(clash))
