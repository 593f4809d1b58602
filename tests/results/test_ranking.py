"""Confidence-aware ranking (`mlmclm.results.ranking`, issue 37 item 1) on stores whose answer is known by construction."""
import contextlib
import io
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from fake_encodeval import write_fixture_tree
from mlmclm.cli import main as cli_main
from mlmclm.base.configs import ConfigError
from mlmclm.results.paper_runs import import_tree
from mlmclm.results.ranking import RankConfig, dataset_ranks, family_ranks, rank_store, rank_systems
from mlmclm.results.store import StoreWriter, load_results, read_examples

ROOT = Path(__file__).resolve().parents[2]
DATASETS = [('sst2', 'SC'), ('mnli_m', 'SC'), ('squad', 'QA')]


def write_store(store: Path, systems: dict, seeds=(0, 1, 2), n: int = 150, extra: dict | None = None,
                without_examples=()) -> Path:
    """`systems`: name -> (offset at the LR validation picks, offset at the other LR) added to one base score per
    example; every seed adds 0.001 * seed. `without_examples`: systems whose rows keep no per-example scores."""
    rows = []
    for k, (ds, fam) in enumerate(DATASETS):
        base = np.random.default_rng(k).random(n) * 0.6 + 0.2
        for name, (picked, other) in systems.items():
            for s in seeds:
                for lr, offset, val in [(1e-4, picked, 0.8), (1e-5, other, 0.6)]:
                    scores = base + offset + 0.001 * s
                    row = dict(checkpoint_name=name, dataset=ds, family=fam, lr=lr, seed=s, val_score=val,
                               test_score=float(scores.mean()), **(extra or {}))
                    if name not in without_examples: row['test_scores_i'] = scores
                    rows.append(row)
    with StoreWriter(store) as w: w.append(rows)
    return store


def ranks_of(store, **config) -> dict:
    "dataset -> checkpoint -> rank, of the one (source, cell) group the store holds."
    t = rank_store(store, config=RankConfig(**config))
    assert t[['source', 'attention', 'pooling', 'precision']].drop_duplicates().shape[0] == 1
    return {ds: g.set_index('checkpoint')['rank'].to_dict() for ds, g in t.groupby('dataset')}


def test_better_on_every_example_is_first_alone(tmp_path):
    # worse at the LR validation does not pick: a ranking on the wrong LR would put it last
    store = write_store(tmp_path/'r.jsonl', {'good': (0.05, -0.3), 'base': (0, 0), 'other': (-0.02, 0)})
    for ds, r in ranks_of(store).items():
        assert r == {'good': 1, 'base': 2, 'other': 3}, ds
    fams = family_ranks(rank_store(store)).set_index(['family', 'checkpoint'])
    assert fams.loc[('SC', 'good'), ['family_rank', 'mean_rank', 'n_datasets']].tolist() == [1, 1.0, 2]
    assert fams.loc[('SC', 'other'), 'family_rank'] == 3


def test_identical_systems_share_one_cluster(tmp_path):
    store = write_store(tmp_path/'r.jsonl', {'a': (0, 0), 'b': (0, 0), 'worse': (-0.05, 0)})
    for r in ranks_of(store).values():
        assert r == {'a': 1, 'b': 1, 'worse': 2}


def test_a_tie_within_tolerance_is_one_cluster(tmp_path):
    store = write_store(tmp_path/'r.jsonl', {'near': (0.004, 0), 'base': (0, 0)})
    for r in ranks_of(store).values(): assert r == {'near': 1, 'base': 1}
    for r in ranks_of(store, bootstrap=True).values(): assert r == {'near': 1, 'base': 1}
    # the authors' rule (p alone): a constant lead of 0.004 is significant, so two clusters
    for r in ranks_of(store, tie_epsilon=0).values(): assert r == {'near': 1, 'base': 2}


def test_rank_systems_directly():
    base = np.random.default_rng(3).random(200)
    r = rank_systems(pd.DataFrame({'x': base, 'y': base + 0.1, 'z': base})).set_index('system')
    assert r['rank'].to_dict() == {'y': 1, 'x': 2, 'z': 2}
    assert r.score['y'] == pytest.approx(base.mean() + 0.1)


def test_sources_and_protocol_cells_are_ranked_apart(tmp_path):
    store = write_store(tmp_path/'r.jsonl', {'good': (0.05, 0), 'base': (0, 0)})
    write_store(tmp_path/'r.jsonl', {'good': (-0.05, 0), 'base': (0, 0)}, extra=dict(source='authors'))
    write_store(tmp_path/'r.jsonl', {'good': (0, 0), 'base': (0, 0)}, extra=dict(attention='causal'))
    t = rank_store(store)
    by = {(s, a): g[g.dataset == 'sst2'].set_index('checkpoint')['rank'].to_dict()
          for (s, a), g in t.groupby(['source', 'attention'])}
    assert by == {('ours', 'bidirectional'): {'good': 1, 'base': 2}, ('authors', 'bidirectional'): {'base': 1, 'good': 2},
                  ('ours', 'causal'): {'good': 1, 'base': 1}}
    assert list(dict.fromkeys(t.source)) == ['ours', 'authors']
    assert set(rank_store(store, source='authors').source) == {'authors'}
    with pytest.raises(ConfigError, match=r"source='theirs': the store holds rows of \['authors', 'ours'\] only"):
        rank_store(store, source='theirs')


def test_a_table_without_a_source_column(tmp_path):
    store = write_store(tmp_path/'r.jsonl', {'good': (0.05, 0), 'base': (0, 0)})
    results = load_results(store).drop(columns=['source'])
    t = dataset_ranks(results, read_examples(store))
    assert set(t.source) == {'ours'} and set(t[t.checkpoint == 'good']['rank']) == {1}


def test_systems_without_per_example_scores_are_listed_not_ranked(tmp_path):
    store = write_store(tmp_path/'r.jsonl', {'good': (0.05, 0), 'base': (0, 0), 'old': (0.1, 0)}, without_examples=['old'])
    t = rank_store(store).set_index(['dataset', 'checkpoint'])
    assert np.isnan(t.loc[('sst2', 'old'), 'rank']) and t.loc[('sst2', 'old'), 'note'] == 'no per-example test scores'
    assert t.loc[('sst2', 'old'), 'score'] == pytest.approx(t.loc[('sst2', 'good'), 'score'] + 0.05)   # its mean is still shown
    assert t.loc[('sst2', 'good'), 'rank'] == 1 and t.loc[('sst2', 'good'), 'n_systems'] == 2


def test_intervals_beside_the_ranks(tmp_path):
    store = write_store(tmp_path/'r.jsonl', {'good': (0.05, 0), 'base': (0, 0)})
    t = rank_store(store).set_index(['dataset', 'checkpoint'])
    g = t.loc['sst2']
    assert (g.ci_low < g.score).all() and (g.score < g.ci_high).all()          # t-interval over seeds
    assert (g.boot_low < g.score).all() and (g.score < g.boot_high).all()      # bootstrap over examples
    assert g.loc['base', 'gap'] == pytest.approx(0.05) and g.loc['base', 'gap_low'] < 0.05 < g.loc['base', 'gap_high']
    assert np.isnan(g.loc['good', 'gap'])


def test_imported_authors_runs(tmp_path):
    # the fixture's test scores grow with the model's index (0.08 each): mlm20 > clm > mlm40 on every dataset but NQ
    root = write_fixture_tree(tmp_path/'enc', models=('610m-mlm40-42k', '610m-clm-42k', '610m-mlm20-42k'), n_examples=300)
    import_tree(root, tmp_path/'r.jsonl', progress=False)
    t = rank_store(tmp_path/'r.jsonl')
    assert set(t.source) == {'authors'}
    for ds, g in t.groupby('dataset'):
        r = g.set_index('checkpoint')['rank']
        if ds == 'nq':
            assert r.isna().all() and g.note.str.contains("NQ test halves are drawn unseeded").all()
            assert g.boot_low.isna().all()
        else:
            assert r.to_dict() == {'610m-mlm20-42k': 1, '610m-clm-42k': 2, '610m-mlm40-42k': 3}, ds


def test_command(tmp_path):
    store = write_store(tmp_path/'r.jsonl', {'good': (0.05, 0), 'base': (0, 0)})
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert cli_main(['results', 'rank', str(store), '--out', str(tmp_path/'fig'), '--bootstrap', '--num-splits', '50']) == 0
    assert 'SC sst2: #1 good ' in out.getvalue() and 'SC family: #1 good (mean rank 1.00 over 2)' in out.getvalue()
    assert sorted(p.name for p in (tmp_path/'fig').iterdir()) == ['family_ranking.csv', 'ranking-ours.pdf', 'ranking-ours.png',
                                                                 'ranking.csv']
    assert pd.read_csv(tmp_path/'fig'/'ranking.csv').query("checkpoint == 'good'")['rank'].tolist() == [1, 1, 1]
    for bad, msg in [(['--tie-epsilon', '-1'], 'tie_epsilon=-1.0'), (['--num-splits', '1'], 'num_splits=1')]:
        err = io.StringIO()
        with contextlib.redirect_stderr(err), pytest.raises(SystemExit) as e: cli_main(['results', 'rank', str(store), *bad])
        assert e.value.code == 2 and msg in err.getvalue(), err.getvalue()
    with pytest.raises(ConfigError, match='a CSV table keeps no per-example scores'): rank_store(tmp_path/'t.csv')


def test_ranking_imports_without_torch():
    code = "import sys, mlmclm.results.ranking; print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))"
    out = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0 and out.stdout.strip() == '[]', out.stderr
