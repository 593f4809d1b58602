"""Rows of a results store as a fine-tuning sweep writes them, for the tests that build stores by hand."""
from pathlib import Path

import mlmclm.results.store as res

BASE = dict(checkpoint_name='610m-clm-42k', dataset='sst2', family='SC', lr=1e-5, best_step=None, steps=1)   # no seed, no scores


def row(ck='m', ds='sst2', lr=1e-4, seed=0, val=.8, test=.7, family='SC', **kw):
    return dict(checkpoint_name=ck, dataset=ds, family=family, lr=lr, seed=seed, val_score=val, test_score=test, **kw)


def write_rows(store, rows):
    "`rows` appended to the store `store` by a writer of its own."
    with res.StoreWriter(store) as w: w.append(rows)


def store_with_rows(tmp_path) -> Path:
    "A store of two runs (seeds 0 and 1 of `BASE`)."
    store = tmp_path/'results.jsonl'
    write_rows(store, [dict(BASE, seed=k, val_score=.5, test_score=.5) for k in range(2)])
    return store
