"""The demo under two numerics (issue 45, item 2): which of the verdicts the README states hold under both.

`figures/demo/compare/numerics/` holds the demo under two numerics on one machine (AMD EPYC), with `.ci/demo`'s steps:
`a/` is the committed demo (tests/fixtures/demo), made under `.ci/demo`'s pins (one thread; `ATEN_CPU_CAPABILITY=avx2
MKL_CBWR=AVX2 ONEDNN_MAX_CPU_ISA=AVX2`); a pinned rerun of it here at 5f49dfa, stopped by a session's end after 50 of
its 96 rows, was identical in all six pretraining losses and in every seed it reached, so `a/provenance.json` is that
rerun's. `b/` is a full rerun at the same commit under
`ATEN_CPU_CAPABILITY=default MKL_CBWR=COMPAT` (torch's and MKL's generic code paths, the way another CPU kind changes
the numbers), each kept by `mlmclm.results.compare.save_side` (results.csv, pretrain_loss.csv, provenance.json);
`compare.*` is `mlmclm compare a b` of the two, and `claims.csv` each verdict of the README under each numerics
(`demo_claims`), with whether it holds under both. Both are regenerated from `a/` and `b/` by

    PYTHONPATH=$PWD .venv/bin/python tests/results/test_compare_demo.py write

and the tests below check the committed files are what the code computes from them."""
import sys
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[2]
NUMERICS = ROOT/'figures'/'demo'/'compare'/'numerics'
FINAL = {'tiny-clm-42k': 'CLM', 'tiny-mlm40-42k': 'MLM-40', 'tiny-mlm20-42k': 'MLM-20',
         'tiny-clm-10k-mlm40-42k': '25% CLM then MLM-40', 'tiny-clm-dec42k-mlm40-54k': 'CPT from CLM',
         'tiny-mlm40-dec42k-mlm40-54k': 'CPT from MLM'}
MLM_FROM_SCRATCH = ('tiny-mlm40-42k', 'tiny-mlm20-42k', 'tiny-clm-10k-mlm40-42k')
CONTROL = 'tiny-random'
NEAR_ENTROPY = 0.2   # nats above the corpus's unigram entropy: "ends near the entropy" (the committed runs: 0.06 to 0.16)


def family_seeds(results: pd.DataFrame) -> pd.DataFrame:
    "Per (checkpoint, family): seed-mean score and seed spread (max - min), percent, of the final models and the control."
    from mlmclm.results.aggregation import seed_family_scores
    s = seed_family_scores(results, 'per_seed')
    s = s[s.checkpoint.isin([*FINAL, CONTROL])]
    g = s.groupby(['checkpoint', 'family']).test_score.agg(['mean', lambda v: v.max() - v.min()]) * 100
    g.columns = ['score', 'spread']
    return g


def _control_claims(g: pd.DataFrame) -> list[dict]:
    """The control comparisons (the rule of tests/report/test_figures.py): on TC, QA and IR the best pretrained model
    beats the control by more than either's seed spread; on SC none does, and none reaches 60%; which model is best."""
    rows = []
    for fam in ('SC', 'TC', 'QA', 'IR'):
        f = g.xs(fam, level='family')
        ctl, best = f.loc[CONTROL], f.drop(CONTROL).score.idxmax()
        beats = bool(f.loc[best, 'score'] - ctl.score > max(ctl.spread, f.loc[best, 'spread']))
        said = 'no pretrained model beats' if fam == 'SC' else 'the best pretrained model beats'
        rows.append(dict(claim=f"control, {fam}: {said} the control by more than either's seed spread",
                         value=f'{FINAL[best]} {f.loc[best, "score"]:.1f} against {ctl.score:.1f} '
                         f'(spreads {f.loc[best, "spread"]:.1f}, {ctl.spread:.1f})', holds=beats == (fam != 'SC')))
        rows.append(dict(claim=f'control, {fam}: the best pretrained model', value=FINAL[best], holds=None))
        if fam == 'SC': continue   # stated the other way round above
        over = [ck for ck in FINAL if f.loc[ck, 'score'] - ctl.score > max(ctl.spread, f.loc[ck, 'spread'])]
        rows.append(dict(claim=f"control, {fam}: some pretrained model beats the control by more than either's seed spread",
                         value=', '.join(FINAL[ck] for ck in over) or 'none', holds=bool(over)))
    sc = g.xs('SC', level='family').drop(CONTROL).score
    rows.append(dict(claim='SC: no model reaches 60%', value=f'best {sc.max():.1f}', holds=bool(sc.max() < 60)))
    return rows


def _pretraining_claims(g: pd.DataFrame, losses: pd.DataFrame) -> list[dict]:
    "MLM from scratch ends near the unigram entropy, CLM far below it; those models score below the control on TC and QA."
    loss = losses.set_index('run').final_loss
    entropy = float(losses.unigram_entropy.iloc[0])   # pretrain_loss.csv as `mlmclm figures` writes it
    mlm = ', '.join(f'{FINAL[r]} {loss[r]:.4f}' for r in MLM_FROM_SCRATCH) + f' (entropy {entropy:.4f})'
    rows = [dict(claim=f'plateau: every MLM-from-scratch run ends within {NEAR_ENTROPY} nats of the entropy', value=mlm,
                 holds=bool(max(abs(loss[r] - entropy) for r in MLM_FROM_SCRATCH) < NEAR_ENTROPY)),
            dict(claim='plateau: CLM ends far below the entropy (more than 0.5 nats)',
                 value=f"CLM {loss['tiny-clm-42k']:.4f}", holds=bool(entropy - loss['tiny-clm-42k'] > 0.5))]
    for fam in ('TC', 'QA'):
        f = g.xs(fam, level='family').score
        rows.append(dict(claim=f'plateau: the MLM-from-scratch models score below the control on {fam}',
                         value=', '.join(f'{FINAL[r]} {f[r]:.1f}' for r in MLM_FROM_SCRATCH) + f'; control {f[CONTROL]:.1f}',
                         holds=all(f[r] < f[CONTROL] for r in MLM_FROM_SCRATCH)))
    return rows


def _direction_claims(results: pd.DataFrame) -> list[dict]:
    "The directions table: each comparison's verdict per family, as the README prints it."
    from mlmclm.report.render import split_control
    from mlmclm.report.tables import directions
    from mlmclm.results.aggregation import protocol_cell, seed_family_scores
    from mlmclm.results.paper_runs import paper_rows, reported_scores
    per_seed = seed_family_scores(protocol_cell(paper_rows(split_control(results)[0])))
    return [dict(claim=f'directions: {r.comparison}, {r.family}', value=f'{r.ours:.1f} [{r.ci_low:.1f}, {r.ci_high:.1f}]',
                 holds=r.verdict) for r in directions(per_seed, reported_scores(), 'tiny').itertuples()]


def demo_claims(folder: Path) -> pd.DataFrame:
    "Every verdict the README states of the demo, computed from the results.csv and pretrain_loss.csv in `folder`."
    results = pd.read_csv(folder/'results.csv')
    g = family_seeds(results)
    rows = _control_claims(g) + _pretraining_claims(g, pd.read_csv(folder/'pretrain_loss.csv')) + _direction_claims(results)
    return pd.DataFrame(rows, columns=['claim', 'value', 'holds'])


def claims_table(a: Path, b: Path) -> pd.DataFrame:
    """`demo_claims` of both numerics side by side: `robust` when the verdict (or the best model) is the same under both;
    a direction's verdict counts by its kind ("same sign, 75x larger" and "same sign, 46x larger" are one)."""
    ca, cb = demo_claims(a), demo_claims(b)
    out = ca.merge(cb, on='claim', suffixes=('_a', '_b'), how='left')
    kind = lambda v: v.astype(str).str.replace(r'\d+x', 'Nx', regex=True)   # "same sign, 75x larger": its kind
    same_holds = kind(out.holds_a) == kind(out.holds_b)
    same_value = out.value_a == out.value_b
    out['robust'] = np.where(out.holds_a.isna() & out.holds_b.isna(), same_value, same_holds)
    return out[['claim', 'value_a', 'holds_a', 'value_b', 'holds_b', 'robust']]


def write(folder: Path = NUMERICS) -> None:
    "Regenerate the comparison and the claims table of the two numerics from `folder`/a and `folder`/b."
    import os
    from mlmclm.results.compare import compare, read_side, write_comparison
    os.chdir(ROOT)   # the figure's title names the sides by their paths from the repository root
    rel = folder.resolve().relative_to(ROOT)
    write_comparison(compare(read_side(rel/'a'), read_side(rel/'b')), folder)
    claims_table(folder/'a', folder/'b').to_csv(folder/'claims.csv', index=False)


def test_the_committed_comparison_of_the_two_numerics_is_what_compare_computes(monkeypatch):
    from mlmclm.results.compare import compare, read_side
    monkeypatch.chdir(ROOT)
    rel = NUMERICS.relative_to(ROOT)
    c = compare(read_side(rel/'a'), read_side(rel/'b'))
    committed = pd.read_csv(NUMERICS/'compare.csv')
    fresh = pd.read_csv(__import__('io').StringIO(c.table.to_csv(index=False, float_format='%.6g')))
    pd.testing.assert_frame_equal(committed, fresh)
    assert c.provenance_differences.keys() == {'kernels'}, c.provenance_differences   # one machine, one commit


def test_the_committed_claims_table_is_what_the_two_numerics_give():
    committed = pd.read_csv(NUMERICS/'claims.csv')
    fresh = pd.read_csv(__import__('io').StringIO(claims_table(NUMERICS/'a', NUMERICS/'b').to_csv(index=False)))
    pd.testing.assert_frame_equal(committed, fresh)


def test_the_a_side_is_the_committed_demo():
    "The pinned run of `a/` is the committed demo, bit for bit: its robustness is the committed results' robustness."
    from mlmclm.results.compare import compare, read_side
    c = compare(read_side(NUMERICS/'a'), read_side(ROOT/'tests'/'fixtures'/'demo'))
    assert c.table.identical.all(), c.table[~c.table.identical].to_string()


if __name__ == '__main__':
    if sys.argv[1:] != ['write']: sys.exit(f'usage: {sys.argv[0]} write')
    write()
    print(pd.read_csv(NUMERICS/'claims.csv').to_string(index=False))
