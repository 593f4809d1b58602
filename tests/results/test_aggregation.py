"""Aggregations of a store's rows (`mlmclm.results.aggregation`): a run stored twice counts once, and rows of other
sources, settings, precisions or token limits are kept apart in every table instead of averaged."""
import pandas as pd

from mlmclm.base.files import append_jsonl
from mlmclm.results.aggregation import aggregate, family_scores
from mlmclm.results.store import load_results

from result_rows import row


# ---------------------------------------------------------------- issue 17 (data loss, silent wrong answers), item 6
def test_item6_a_run_stored_twice_counts_once(tmp_path):
    store = tmp_path/'results.jsonl'
    for _ in range(2):                                          # two processes on the same checkpoint
        for seed in (0, 1): append_jsonl(store, row(seed=seed, test=.7 + seed / 10))
    res = load_results(store)
    assert aggregate(res).n_seeds.tolist() == [2]
    assert family_scores(res).n_seeds.tolist() == [2]
    doubled = pd.concat([res, res])                             # whatever table is handed in
    assert aggregate(doubled).n_seeds.tolist() == [2]
