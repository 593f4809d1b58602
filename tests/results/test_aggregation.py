"""Aggregations of a store's rows (`mlmclm.results.aggregation`): a run stored twice counts once, and rows of other
sources, settings, precisions or token limits are kept apart in every table instead of averaged."""
import pandas as pd
import pytest

import mlmclm.results.aggregation as aggr
import mlmclm.results.store as res
from mlmclm.base.files import append_jsonl
from mlmclm.results.aggregation import aggregate, family_scores
from mlmclm.results.store import load_results
from mlmclm.base.configs import ConfigError

from result_rows import BASE, row, write_rows


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


# --------------------------------------------- third fault attack (issue 34), the cases of ../shared/faults/attack-3.md
# N1: our rows and the authors' rows of one model, written in either order -------------------------------------------
@pytest.mark.parametrize('authors_first', [True, False])
def test_sources_stay_apart_in_every_aggregation(tmp_path, authors_first):
    store = tmp_path/'results.jsonl'
    ours = [dict(BASE, seed=k, val_score=.9, test_score=.9, source='ours') for k in range(3)]
    theirs = [dict(BASE, seed=k, val_score=.1, test_score=.1, source='authors') for k in range(5)]
    for rows in ((theirs, ours) if authors_first else (ours, theirs)): write_rows(store, rows)
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


# N4: aggregations never mix rows of other settings
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


# N22: precision 'auto' that ran fp32 and pure bf16 -----------------------------------------------------------------
def test_auto_precision_that_ran_differently_is_two_cells():
    rows = [dict(BASE, seed=k, val_score=.5, test_score=.5, precision='auto', precision_used='fp32') for k in range(3)]
    rows += [dict(BASE, seed=k, val_score=.9, test_score=.9, precision='auto', precision_used='pure_bf16') for k in range(3, 5)]
    fam = aggr.family_scores(pd.DataFrame(rows)).set_index('cell')
    assert fam.score.to_dict() == pytest.approx({'precision_used=fp32': .5, 'precision_used=pure_bf16': .9})


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
