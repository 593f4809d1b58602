"""Issue 44 item 1: a finished sweep's rows are readable at once. `finetune_sweep` returns the store's results after
the sweep (`load_results` of its path, the path in `.attrs['store']`), also while another sweep writes the same store;
`load_results(path)` reads any store in one line, and after `compact` the path itself is a JSON-lines file of rows."""
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pandas as pd
import pytest

import mlmclm.finetuning.sweep as sw
from mlmclm.protocol.runs import FinetuneConfig
from mlmclm.results.compaction import compact
from mlmclm.results.store import load_results, read_rows

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.usefixtures('one_thread')   # tiny models: one thread is faster (conftest.py)
TINY = dict(tasks='rt_sentiment', lrs='1e-3', max_steps=1, eval_every=1, batch_size=4, micro_batch_size=4,
            max_eval_examples=4, feature_cache='off', progress=False)


def runs(table: pd.DataFrame) -> list:
    return sorted(zip(table.dataset, table.lr, table.seed))


def test_a_sweep_returns_the_stores_results_with_its_rows(tmp_path):
    store = tmp_path/'r.jsonl'
    res = sw.finetune_sweep(FinetuneConfig(seeds='0,1', results=str(store), **TINY))
    assert res.attrs['store'] == str(store) and runs(res) == [('rt_sentiment', 1e-3, 0), ('rt_sentiment', 1e-3, 1)]
    assert res.test_score.between(0, 1).all()
    assert not store.exists()                      # the rows are in the writer's shard: the path is no file to open
    pd.testing.assert_frame_equal(res, load_results(store))   # the one line that reads any store
    again = sw.finetune_sweep(FinetuneConfig(seeds='0,1,2', results=str(store), **TINY))   # one more run; two found done
    assert runs(again) == runs(res) + [('rt_sentiment', 1e-3, 2)] and len(read_rows(store)) == 3
    assert compact(store)['rows'] == 3
    assert sorted(pd.read_json(store, lines=True).seed) == [0, 1, 2]   # compacted, the path itself is the rows


SWEEP = textwrap.dedent("""
    import json, os, sys, time
    from pathlib import Path
    import mlmclm.finetuning.sweep as sw
    from mlmclm.protocol.runs import FinetuneConfig
    me, other, store, tiny = sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4])
    real = sw.finetune_run
    def first_waits(*a, **k):   # each sweep's first run starts only once the other's has: both write at once
        Path(me).touch()
        deadline = time.monotonic() + 120
        while not Path(other).exists() and time.monotonic() < deadline: time.sleep(0.05)
        return real(*a, **k)
    sw.finetune_run = first_waits
    res = sw.finetune_sweep(FinetuneConfig(seeds='0,1,2,3,4,5', results=store, **tiny))
    print(json.dumps(dict(pid=os.getpid(), store=res.attrs['store'], runs=[[r.dataset, r.lr, r.seed] for r in res.itertuples()])))
""")


def test_two_sweeps_writing_one_store_at_once_each_return_their_rows(tmp_path):
    store = tmp_path/'shared'/'results.jsonl'
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS='1', MKL_NUM_THREADS='1')
    marks = [tmp_path/'a.started', tmp_path/'b.started']
    procs = [subprocess.Popen([sys.executable, '-c', SWEEP, str(me), str(other), str(store), json.dumps(TINY)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path)
             for me, other in (marks, marks[::-1])]
    outs = []
    for p in procs:
        out, err = p.communicate(timeout=600)
        assert p.returncode == 0, err[-3000:]
        outs.append(json.loads(out.strip().splitlines()[-1]))
    final = load_results(store)
    assert runs(final) == [('rt_sentiment', 1e-3, s) for s in range(6)] and len(read_rows(store)) == 6   # each run once
    for o in outs:
        assert o['store'] == str(store)
        written = {(r['dataset'], r['lr'], r['seed']) for r in read_rows(store) if f"-{o['pid']}-" in r['writer']}
        assert written, f"sweep {o['pid']} wrote no row: the two did not share the work"
        assert written <= {tuple(r) for r in o['runs']}, (written, o['runs'])   # its own rows are in what it returned
    assert max(len(o['runs']) for o in outs) == 6   # the sweep that ended last returned every run of both
