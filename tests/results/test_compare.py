"""`mlmclm compare`: the verdict rules on constructed seeds and stores, the authors' shared SC runs against themselves
and a perturbed copy, the refusal of other protocols, the pretraining losses (the same numbers as `pretrain_loss.csv`),
the command, and the table and figure files."""
import json
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from mlmclm.base.files import project_root
from mlmclm.results.compare import (Difference, NOT_KNOWN, compare, difference, read_side, run_losses, save_side,
                                    study_pretraining, summary_lines, verdict, write_comparison, write_demo_store,
                                    write_encodeval)

ROOT = project_root()
SHARED = ROOT/'tests'/'fixtures'/'encodeval_sc_610m.csv'
seeds = lambda *v, index=None: pd.Series(v, dtype=float, index=index)


def test_tost_is_the_90_percent_interval_inside_the_margin():
    "Schuirmann's two one-sided tests at 5% each, computed as p-values, decide as the 90% interval rule does."
    a, b = seeds(61, 64, 66, 70), seeds(60, 62, 65, 67)
    d = difference(a, b)
    diffs = (a - b).to_numpy()
    se, dof = diffs.std(ddof=1) / np.sqrt(len(diffs)), len(diffs) - 1
    for margin in (1.0, 2.0, 3.0, 4.0, 6.0):
        p_low = 1 - stats.t.cdf((diffs.mean() + margin) / se, dof)     # H0: difference <= -margin
        p_high = stats.t.cdf((diffs.mean() - margin) / se, dof)        # H0: difference >= +margin
        assert (max(p_low, p_high) < 0.05) == (verdict(d, margin) in ('agree', 'within margin')), margin
    assert d.test == 'paired' and d.diff == pytest.approx(1.75)
    assert stats.ttest_rel(a, b).pvalue < 0.05 and verdict(d, 6.0) == 'within margin'   # different, and within 6


@pytest.mark.parametrize('a, b, margin, want', [
    ((50, 60, 70), (50, 60, 70), 2, 'agree'),                     # bit-identical seeds
    ((50.4, 60.4, 70.4), (50, 60, 70), 2, 'within margin'),       # a real shift of 0.4 points
    ((50.4, 60.4, 70.4), (50, 60, 70), 0.3, 'differ'),            # ... larger than a 0.3-point margin
    ((58, 71, 79), (50, 60, 70), 2, 'differ'),
    ((45, 70, 55), (50, 60, 70), 2, 'undetermined'),              # 3 noisy seeds cannot tell
    ((50,), (50, 60, 70), 2, 'too few seeds'),
    ((), (50, 60, 70), 2, 'too few seeds'),
])
def test_verdicts(a, b, margin, want):
    assert verdict(difference(seeds(*a), seeds(*b)), margin) == want


def test_seeds_of_other_numbers_are_compared_by_welch():
    d = difference(seeds(50, 60, 70, index=[0, 1, 2]), seeds(52, 61, 69, index=[5, 6, 7]))
    assert d.test == 'welch' and d.low < 0 < d.high
    from mlmclm.results.aggregation import diff_interval
    assert (d.diff, d.low, d.high) == pytest.approx(diff_interval([50, 60, 70], [52, 61, 69]))


def _stores(tmp_path, **variants):
    "A base store and a variant store per keyword (scores of (checkpoint, dataset) replaced)."
    base = {('tiny', 'sst2'): [.50, .60, .70], ('tiny', 'conll2003_en'): [.80, .82, .84], ('other', 'sst2'): [.55, .58, .61]}
    sides = {'base': read_side(write_demo_store(tmp_path/'base.jsonl', base))}
    for name, change in variants.items():
        sides[name] = read_side(write_demo_store(tmp_path/f'{name}.jsonl', {**base, **change}))
    return sides


def test_known_answers_on_constructed_stores(tmp_path):
    s = _stores(tmp_path, same={}, moved={('tiny', 'conll2003_en'): [.90, .92, .94]},
                nudged={('other', 'sst2'): [.556, .586, .616]}, fewer={('tiny', 'sst2'): [.5]})
    verdicts = lambda name: compare(s['base'], s[name]).table.set_index(['kind', 'checkpoint', 'what']).verdict.to_dict()
    assert set(verdicts('same').values()) == {'agree'}
    moved = verdicts('moved')
    assert {k: v for k, v in moved.items() if v != 'agree'} == {('dataset', 'tiny', 'conll2003_en'): 'differ',
                                                               ('family', 'tiny', 'TC'): 'differ'}
    nudged = verdicts('nudged')
    assert nudged[('dataset', 'other', 'sst2')] == 'within margin' and nudged[('dataset', 'tiny', 'sst2')] == 'agree'
    fewer = verdicts('fewer')
    assert fewer[('dataset', 'tiny', 'sst2')] == 'too few seeds' and fewer[('dataset', 'other', 'sst2')] == 'agree'
    lines = summary_lines(compare(s['base'], s['moved']))
    assert lines[0] == '2 of 3 checkpoint x dataset cells agree within 2 points (2 identical); 1 differ', lines


def test_a_cell_one_side_lacks_is_named_not_compared(tmp_path):
    a = read_side(write_demo_store(tmp_path/'a.jsonl', {('tiny', 'sst2'): [.5, .6, .7], ('tiny', 'qqp'): [.7, .7, .8]}))
    b = read_side(write_demo_store(tmp_path/'b.jsonl', {('tiny', 'sst2'): [.5, .6, .7]}))
    t = compare(a, b).table.set_index(['kind', 'checkpoint', 'what'])
    assert t.verdict[('dataset', 'tiny', 'qqp')] == 'only in A'
    assert t.verdict[('family', 'tiny', 'SC')] != 'agree'        # the family means hold other datasets
    assert '1 of 2 checkpoint x dataset cells' not in summary_lines(compare(a, b))[0]
    assert summary_lines(compare(a, b))[0].startswith('1 of 1 checkpoint x dataset cells agree')


def _shared_sides(tmp_path):
    runs = pd.read_csv(SHARED, comment='#', dtype={'lr': str})
    perturbed = runs.copy()
    hit = (perturbed.model == '610m-mlm40-42k') & (perturbed.dataset == 'qqp')
    perturbed.loc[hit, 'test_score'] = (perturbed.loc[hit, 'test_score'] - 0.03).clip(lower=0)
    return [read_side(write_encodeval(r, tmp_path/name), scratch=tmp_path/f'{name}-store')
            for name, r in (('theirs', runs), ('again', runs), ('perturbed', perturbed))]


def test_the_authors_shared_sc_runs_agree_with_themselves_and_flag_a_perturbed_copy(tmp_path):
    theirs, again, perturbed = _shared_sides(tmp_path)
    assert theirs.provenance['source'] == 'authors' and len(theirs.results) == 175
    same = compare(theirs, again).table
    assert (same.verdict == 'agree').all() and same.identical.all() and len(same) == 2 * (3 + 1)   # 2 models x (3 datasets + SC)
    off = compare(theirs, perturbed).table.set_index(['kind', 'checkpoint', 'what'])
    flagged = off[off.verdict != 'agree']
    assert sorted(flagged.index) == [('dataset', '610m-mlm40-42k', 'qqp'), ('family', '610m-mlm40-42k', 'SC')]
    assert flagged.verdict.tolist() == ['differ', 'within margin']   # 3 points on one of three datasets: 1 point on SC
    assert off.loc[('dataset', '610m-mlm40-42k', 'qqp'), 'diff'] == pytest.approx(3, abs=1e-6)


def test_other_protocols_are_refused_naming_the_difference_unless_asked(tmp_path):
    base = {('tiny', 'sst2'): [.5, .6, .7]}
    a = write_demo_store(tmp_path/'a.jsonl', base, max_steps=200, batch_size=8, special_tokens='eos')
    b = write_demo_store(tmp_path/'b.jsonl', base, max_steps=200, batch_size=8, special_tokens='bos_eos')
    cmd = [sys.executable, '-m', 'mlmclm.results.compare', str(a), str(b)]
    run = lambda *extra: subprocess.run([*cmd, *extra], capture_output=True, text=True, cwd=ROOT, timeout=120)
    refused = run()
    assert refused.returncode == 2, refused.stdout
    assert "tiny on sst2: special_tokens 'eos' (A) against 'bos_eos' (B)" in refused.stderr
    assert '--any-protocol' in refused.stderr
    allowed = run('--any-protocol')
    assert allowed.returncode == 0, allowed.stderr
    assert 'compared across protocols (--any-protocol):' in allowed.stdout and '1 of 1 checkpoint x dataset' in allowed.stdout


def test_the_package_command_runs_compare(tmp_path, capsys):
    from mlmclm.cli import main
    a = write_demo_store(tmp_path/'a.jsonl', {('tiny', 'sst2'): [.5, .6, .7]})
    assert main(['compare', str(a), str(a)]) == 0
    assert '1 of 1 checkpoint x dataset cells agree within 2 points (1 identical)' in capsys.readouterr().out


def test_provenance_differences_are_named(tmp_path):
    side = read_side(write_demo_store(tmp_path/'a.jsonl', {('tiny', 'sst2'): [.5, .6, .7]}))
    side.provenance = dict(side.provenance, cpu='AMD EPYC', kernels='AVX2', torch='2.13.0')
    save_side(side, tmp_path/'kept')
    other = read_side(tmp_path/'kept')
    other.provenance = dict(other.provenance, kernels='DEFAULT')
    c = compare(side, other)
    assert c.provenance_differences == {'kernels': ('AVX2', 'DEFAULT')}
    from mlmclm.results.compare import report
    assert '* kernels          AVX2 | DEFAULT' in report(c) and '  cpu              AMD EPYC | AMD EPYC' in report(c)


def test_pretraining_losses_are_those_of_pretrain_loss_csv(tmp_path):
    "`study_pretraining` gives the numbers `mlmclm figures` writes into pretrain_loss.csv (`collect_pretrain_loss`)."
    from mlmclm.report.render import collect_pretrain_loss
    rng = np.random.default_rng(0)
    for run, phases in (('tiny-clm-42k', [0] * 30), ('tiny-clm-10k-mlm40-42k', [0] * 8 + [1] * 22)):
        (tmp_path/run).mkdir()
        rows = [dict(step=10 * (i + 1), phase=p, objective='clm' if p == 0 else 'mlm', mask_ratio=None if p == 0 else 0.4,
                     loss=float(8 - i / 10 + rng.normal(0, .05)), heldout_loss=float(rng.uniform(6, 7)) if i % 7 == 6 else None)
                for i, p in enumerate(phases)]
        (tmp_path/run/'metrics.jsonl').write_text(''.join(json.dumps(r) + '\n' for r in rows))
    ours = study_pretraining(tmp_path).set_index('run')
    theirs = collect_pretrain_loss(tmp_path, 7.0).set_index('run')
    assert ours.index.tolist() == theirs.index.tolist() == ['tiny-clm-10k-mlm40-42k', 'tiny-clm-42k']
    for col in ('final_loss', 'heldout_loss'):
        assert ours[col].tolist() == theirs[col].round(4).tolist(), col
    assert run_losses([]) is None


def test_pretraining_of_other_lengths_is_refused_and_losses_judged_at_the_loss_margin(tmp_path):
    for name, rows in (('a', [('tiny-clm-42k', 336, 6.2443, 5.9669), ('tiny-mlm40-42k', 336, 7.0930, 6.8953)]),
                       ('b', [('tiny-clm-42k', 336, 6.2443, 5.9969), ('tiny-mlm40-42k', 336, 7.1030, 6.8953)]),
                       ('c', [('tiny-clm-42k', 80, 7.1199, 6.9311)])):
        pd.DataFrame(rows, columns=['run', 'steps', 'final_loss', 'heldout_loss']).to_csv(tmp_path/f'{name}.csv', index=False)
    a, b, c = (read_side(tmp_path/f'{n}.csv') for n in 'abc')
    t = compare(a, b, loss_margin=0.02).table.set_index(['kind', 'checkpoint']).verdict.to_dict()
    assert t == {('pretraining final', 'tiny-clm-42k'): 'agree', ('pretraining held-out', 'tiny-clm-42k'): 'differ',
                 ('pretraining final', 'tiny-mlm40-42k'): 'agree', ('pretraining held-out', 'tiny-mlm40-42k'): 'agree'}
    from mlmclm.base.configs import ConfigError
    with pytest.raises(ConfigError, match='tiny-clm-42k: 336 steps \\(A\\) against 80 \\(B\\)'): compare(a, c)


def test_the_table_is_written_atomically_and_the_figure_byte_stably(tmp_path):
    s = _stores(tmp_path, moved={('tiny', 'conll2003_en'): [.90, .92, .94]})
    c = compare(s['base'], s['moved'])
    files = write_comparison(c, tmp_path/'out')
    assert sorted(f.name for f in files) == ['compare.csv', 'compare.md', 'compare.pdf', 'compare.png']
    first = {f.name: f.read_bytes() for f in files}
    write_comparison(c, tmp_path/'out')
    assert {f.name: f.read_bytes() for f in files} == first
    assert not [f for f in (tmp_path/'out').iterdir() if f.name.startswith('.')]   # no temporary file left
    table = pd.read_csv(tmp_path/'out'/'compare.csv')
    assert table.verdict.value_counts().to_dict() == {'agree': 4, 'differ': 2}


def test_a_store_and_the_table_kept_of_it_are_identical(tmp_path):
    "Scores are compared to the six significant digits a results table keeps: a store against its own table is identical."
    store = write_demo_store(tmp_path/'a.jsonl', {('tiny', 'sst2'): [.5123456789, .6198765432, .7011111111],
                                                  ('tiny', 'qqp'): [.3333333333, .4444444444, .5555555555]})
    side = read_side(store)
    save_side(side, tmp_path/'kept')
    assert pd.read_csv(tmp_path/'kept'/'results.csv').test_score.iloc[0] == 0.333333   # '%.6g': six significant digits
    c = compare(side, read_side(tmp_path/'kept'))
    assert c.table.identical.all() and (c.table.verdict == 'agree').all(), c.table


def test_a_side_that_holds_nothing_is_refused(tmp_path):
    from mlmclm.base.configs import ConfigError
    (tmp_path/'empty').mkdir()
    with pytest.raises(ConfigError, match='holds no fine-tuning rows and no pretraining runs'): read_side(tmp_path/'empty')
