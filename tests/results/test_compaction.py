"""Compaction and the health of a store (`mlmclm.results.compaction`): a store path that does not exist is refused
without creating anything, and a store may not take the name of another store's per-example scores file (the third
fault attack, issue 34: N24 and N6 of ../shared/faults/attack-3.md)."""
import pytest

import mlmclm.results.compaction as comp
import mlmclm.results.store as res
from mlmclm import core
from mlmclm.base.configs import ConfigError

from result_rows import BASE, write_rows


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
    write_rows(a, [dict(BASE, seed=k, val_score=.5, test_score=.5, test_scores_i=[1., 0., float(k)]) for k in range(3)])
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
