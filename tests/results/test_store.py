"""The results store from the outside: what a sweep writes (provenance, per-example scores, supersession), the
checkpoint-name guard, stores written before shards, the health / compact / status commands, and which runs a
store holds (imported rows are not ours; a row counts for the precision it was asked for); garbage lines are skipped
and named; a damaged legacy per-example scores file is named with what to do."""
import json
import warnings
from pathlib import Path

import numpy as np
import pytest

import mlmclm.finetuning.loop as ft

import mlmclm.finetuning.sweep as sw
import mlmclm.results.store as res
import mlmclm.results.compaction as comp
import mlmclm.results.aggregation as aggr
from mlmclm.base.configs import ConfigError
from mlmclm.base.files import append_jsonl
from mlmclm.protocol.runs import FinetuneConfig, FinetuneRun, PretrainRun, finetune_runs, row_cell, run_key
from mlmclm.results.store import StoreWriter, load_results, missing, read_examples, read_rows
from mlmclm import core
from mlmclm.protocol.runs import sweep_settings

from tiny import tiny_cfg, tiny_checkpoint
from result_rows import BASE, row, store_with_rows, write_rows


pytestmark = pytest.mark.usefixtures('one_thread')   # tiny models: one thread is faster (conftest.py)


def test_every_row_of_a_sweep_carries_its_provenance(tmp_path):
    ck = tiny_checkpoint(tmp_path/'ck', run_id='run', step=30)
    sw.finetune_sweep(tiny_cfg(tmp_path, checkpoint=str(ck)))
    (row,) = read_rows(tmp_path/'results.jsonl')
    for k in ('code', 'config_hash', 'checkpoint_id', 'host', 'written_at', 'wall_time_s', 'writer', 'row_id'):
        assert row.get(k) not in (None, ''), k
    assert row['checkpoint_name'] == 'run-step-30' and row['checkpoint_id'] == res.checkpoint_identity(str(ck))
    assert row['pretrain_step'] == 30


def test_per_example_scores_of_a_sweep_go_to_the_sidecar(tmp_path, monkeypatch):
    real = ft.finetune_run
    def with_scores(*a, **k):   # what the fine-tuning loop returns once it keeps per-example scores
        return [dict(r, val_scores_i=[1.0, 0.0], test_scores_i=[0.0, 1.0, 1.0]) for r in real(*a, **k)]
    monkeypatch.setattr(sw, 'finetune_run', with_scores)
    sw.finetune_sweep(tiny_cfg(tmp_path))
    store = tmp_path/'results.jsonl'
    (row,) = read_rows(store)
    assert not any(k.endswith('_scores_i') for k in row)       # the main table stays small
    key = res.run_key(row)
    assert read_examples(store)[key].tolist() == [0, 1, 1] and read_examples(store, 'val')[key].tolist() == [1, 0]
    boot = aggr.bootstrap_intervals(load_results(store), read_examples(store), n_boot=50)
    assert len(boot) == 1 and boot.score.item() == pytest.approx(2 / 3)


def test_force_re_runs_once_and_supersedes_with_its_reason(tmp_path):
    cfg = tiny_cfg(tmp_path)
    sw.finetune_sweep(cfg)
    sw.finetune_sweep(cfg, force='new tokenizer')
    sw.finetune_sweep(cfg, force='new tokenizer')               # the same reason: already re-run
    rows = read_rows(tmp_path/'results.jsonl')
    assert len(rows) == 2 and [r.get('supersedes') for r in rows] == [None, 'new tokenizer']
    assert load_results(tmp_path/'results.jsonl').supersedes.tolist() == ['new tokenizer']


def test_a_name_already_used_for_another_checkpoint_is_refused(tmp_path):
    a = tiny_checkpoint(tmp_path/'a', seed=1)
    b = tiny_checkpoint(tmp_path/'b', seed=2)
    sw.finetune_sweep(tiny_cfg(tmp_path, checkpoint=str(a), checkpoint_name='mine'))
    with pytest.raises(ConfigError, match="checkpoint_name='mine' is already in .* for another checkpoint"):
        sw.finetune_sweep(tiny_cfg(tmp_path, checkpoint=str(b), checkpoint_name='mine', seeds='1'))
    sw.finetune_sweep(tiny_cfg(tmp_path, checkpoint=str(a), checkpoint_name='mine', seeds='1'))   # the same one: fine


def test_a_store_from_before_shards_is_still_read(tmp_path):
    store = tmp_path/'results.jsonl'
    row = dict(checkpoint_name='610m-clm-42k', dataset='sst2', family='SC', lr=1e-5, seed=0, val_score=.9, test_score=.8)
    append_jsonl(store, row)
    np.savez_compressed(f'{store}.examples.npz', **{res.run_key(row): np.array([1, 0, 1], dtype=np.float32)})
    with res.StoreWriter(store) as w: w.append([dict(row, seed=1)])
    assert sorted(load_results(store).seed) == [0, 1]
    assert read_examples(store)[res.run_key(row)].tolist() == [1, 0, 1]


def test_health_and_compact_commands(tmp_path, capsys):
    store = tmp_path/'results.jsonl'
    row = dict(checkpoint_name='m', dataset='sst2', family='SC', lr=1e-4, seed=0, val_score=.5, test_score=.5)
    for seed in (0, 0, 1):
        with res.StoreWriter(store) as w: w.append([dict(row, seed=seed)])
    with open(store, 'a') as f: f.write('{"checkpoint_name": "m"}\n')
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')
        comp.main(['health', str(store)])
        out = capsys.readouterr().out
        assert 'runs 2 from 3 complete rows (1 duplicates counted once' in out and 'shards: 3 closed' in out
        assert 'results.jsonl: 1' in out
        comp.main(['compact', str(store)])
        assert "'shards': 3, 'rows': 3, 'rejected': 1" in capsys.readouterr().out
        comp.main(['health', str(store)])
        assert 'shards: none' in capsys.readouterr().out
    with pytest.raises(SystemExit): comp.main(['compact', str(tmp_path/'r.csv')])
    assert "names a CSV table" in capsys.readouterr().err


def test_status_command_counts_per_experiment(tmp_path, capsys):
    from mlmclm.study.commands import main
    root = tmp_path/'study'
    (root/'tiny-clm-42k').mkdir(parents=True); (root/'tiny-clm-42k'/'done.json').write_text('{}')
    held = PretrainRun('tiny-mlm40-42k', root).try_claim()
    try: main(['status', '--preset', 'demo', '--experiments', 'E1', '--root', str(root)])
    finally: held.release()
    out = capsys.readouterr().out
    line = next(l for l in out.splitlines() if l.split()[:2] == ['E1', 'pretrain'])
    assert line.split()[2:] == ['1', '1', '0', '1']             # done, running, stale, to do
    assert 'mlmclm results health' in out
    with pytest.raises(SystemExit): main(['status', '--preset', 'demo', '--sizes', '7b', '--root', str(root)])
    assert "unknown size '7b'" in capsys.readouterr().err


def test_protocol_cells_are_different_runs_and_paper_rows_keep_their_keys():
    import pandas as pd
    from mlmclm.protocol.runs import run_key
    from mlmclm.results.store import unique_runs
    row = dict(checkpoint_name='610m-clm-42k', dataset='sst2', lr=1e-4, seed=0)
    assert run_key(row) == run_key(dict(row, attention='bidirectional', pooling='mean')) == '610m-clm-42k|sst2|0.0001|0'
    cells = [dict(row, attention=a, pooling=p) for a in ('bidirectional', 'causal') for p in ('mean', 'last')]
    assert len({run_key(c) for c in cells}) == 4
    assert run_key(dict(row, attention='causal', pooling=float('nan'))) == '610m-clm-42k|sst2|0.0001|0|attention=causal'
    df = pd.DataFrame(cells + cells[:1])
    assert len(unique_runs(df)) == 4


# ---------------------------------------------------------- run identity: imported rows, the precision asked (issue 27)
def test_our_run_of_a_checkpoint_the_authors_also_published_is_not_theirs(tmp_path):
    "Imported rows (source 'authors') never make our own run of the same name look done (issue 27 item 7)."
    store = tmp_path/'results.jsonl'
    ours = finetune_runs('610m-clm-42k', ['sst2'], [1e-5], [0])
    with StoreWriter(store) as w:
        w.append([dict(checkpoint_name='610m-clm-42k', dataset='sst2', family='SC', lr=1e-5, seed=0, source='authors',
                       val_score=.9, test_score=.9)])
    assert missing(store, ours) == ours
    assert missing(store, finetune_runs('610m-clm-42k', ['sst2'], [1e-5], [0], source='authors')) == []


def test_precision_is_keyed_as_asked_and_older_rows_keep_their_keys(tmp_path):
    "A row of an older store holds the format that ran in `precision`: it counts for the paper's cell (`auto`, the only "
    "identity it ever had), never for a run asked for that format; rows written now key what was asked."
    store, row = tmp_path/'results.jsonl', dict(checkpoint_name='610m-clm-42k', family='SC', lr=1e-5, seed=0, val_score=.9,
                                                test_score=.9)
    with StoreWriter(store) as w:
        w.append([dict(row, dataset='sst2', precision='pure_bf16'),                                  # older: as it ran
                  dict(row, dataset='mnli', precision='amp_bf16'),                                   # older: only asked
                  dict(row, dataset='qqp', precision='auto', precision_used='fp32')])                # now: as asked
    runs = lambda ds, **cell: finetune_runs('610m-clm-42k', ds, [1e-5], [0], **cell)
    assert missing(store, runs(['sst2'])) == []
    assert missing(store, runs(['sst2'], precision='pure_bf16')) == runs(['sst2'], precision='pure_bf16')
    assert missing(store, runs(['mnli'])) == runs(['mnli'])           # auto never gives amp_bf16: it was asked by name
    assert missing(store, runs(['mnli'], precision='amp_bf16')) == []
    assert missing(store, runs(['qqp'])) == [] and missing(store, runs(['qqp'], precision='fp32')) == runs(['qqp'], precision='fp32')
    assert [r['precision_used'] for r in read_rows(store)] == ['pure_bf16', 'amp_bf16', 'fp32']


# ---------------------------------------------------------------- issue 17 (data loss, silent wrong answers), item 9
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


# --------------------------------------------- third fault attack (issue 34), the cases of ../shared/faults/attack-3.md
# N4: rows of other settings
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


# N23: learning rates that share 6 significant digits ---------------------------------------------------------------
def test_close_learning_rates_are_different_runs(tmp_path):
    store = tmp_path/'r.jsonl'
    write_rows(store, [dict(BASE, seed=0, val_score=.5, test_score=.5, lr=1e-4)])
    runs = [FinetuneRun('610m-clm-42k', 'sst2', ('sst2',), lr, 0) for lr in (1e-4, 1.000001e-4, 1.0000049e-4)]
    assert res.missing(store, runs) == runs[1:]
    assert run_key(dict(BASE, seed=0, lr=1e-4)) == '610m-clm-42k|sst2|0.0001|0'   # keys written before are unchanged


# A damaged legacy per-example scores file is named (issue 34).
def test_legacy_examples_file_is_named_when_damaged(tmp_path):
    store = store_with_rows(tmp_path)
    Path(f'{store}.examples.npz').write_bytes(b'not an npz')
    with pytest.raises(ValueError, match=r'results\.jsonl\.examples\.npz cannot be read .*per-example test scores'):
        res.read_examples(store)


# --------------------------------------------------------------- a damaged legacy examples file (issue 34 item 10: N26)
ROW = dict(checkpoint_name='m', dataset='sst2', family='SC', lr=1e-4, seed=0, val_score=.5, test_score=.5)


@pytest.mark.parametrize('damage', ['object array', 'not an npz', 'truncated'])
def test_a_damaged_legacy_examples_file_is_named_with_what_to_do(tmp_path, damage):
    store = tmp_path/'results.jsonl'
    with res.StoreWriter(store) as w: w.append([ROW])
    legacy = tmp_path/'results.jsonl.examples.npz'
    if damage == 'object array': np.savez(legacy, k=np.array([{'a': 1}], dtype=object))
    elif damage == 'not an npz': legacy.write_bytes(b'\x80\x04garbage')
    else:
        np.savez(legacy, k=np.arange(100)); legacy.write_bytes(legacy.read_bytes()[:60])
    with pytest.raises(ConfigError) as e: res.read_examples(store)
    msg = str(e.value)
    assert str(legacy) in msg and 'Restore it from a copy, or move it away' in msg and "force='why'" in msg


def test_a_sound_legacy_examples_file_is_still_read(tmp_path):
    store = tmp_path/'results.jsonl'
    with res.StoreWriter(store) as w: w.append([ROW])
    key = next(iter(res.current_rows(res.read_rows(store))))
    np.savez(tmp_path/'results.jsonl.examples.npz', **{key: np.array([1.0, 0.0])})
    assert res.read_examples(store)[key].tolist() == [1.0, 0.0]
