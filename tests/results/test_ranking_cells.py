"""Issue 49 (fourth fault attack), the ranking's cases: N5 (one checkpoint's two budgets merged into one system),
N6 (systems of two dataset revisions paired), N10 and N22 (a score line that is NaN or damaged), N25 (`--out` on a
full disk) and N26 (a `$` in a checkpoint name). Each reproduction is the attack's, made small."""
import base64
import contextlib
import errno
import io
import json
import zlib

import numpy as np
import pandas as pd
import pytest

import mlmclm.results.ranking as ranking
import mlmclm.results.store as res
from result_rows import BUDGET, attack_store

def mk(store, systems, n=200, **kw):
    return attack_store(store, systems, n=n, **kw)


def rank_cli(*args) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try: code = ranking.main([str(a) for a in args]) or 0
        except SystemExit as e: code = e.code
    return code, out.getvalue(), err.getvalue()


# N5 ---------------------------------------------------------------------------------------------------------------
def test_one_checkpoints_two_budgets_are_ranked_apart(tmp_path):
    store = mk(tmp_path/'r8.jsonl', ['A', 'B'], p={'A': .9, 'B': .6}, **BUDGET, max_steps=200)
    mk(store, ['A'], seeds=(3, 4, 5), p={'A': .3}, **BUDGET, max_steps=30)
    code, text, _ = rank_cli(store, '--out', tmp_path/'r8')
    assert code == 0
    assert 'Our runs, protocol bidirectional/mean/auto, max_steps=200:\n  SC sst2: #1 A' in text, text
    assert 'Our runs, protocol bidirectional/mean/auto, max_steps=30:\n  SC sst2: #1 A 3' in text, text
    t = pd.read_csv(tmp_path/'r8'/'ranking.csv')
    a = t[t.checkpoint == 'A'].set_index('cell')
    assert sorted(a.index) == ['max_steps=200', 'max_steps=30'] and a.n_seeds.tolist() == [3, 3]
    assert pd.api.types.is_float_dtype(t.boot_low) and pd.api.types.is_float_dtype(t.boot_high)   # numbers, not 'boot_low'
    assert a.loc['max_steps=200', 'score'] > .85 > .35 > a.loc['max_steps=30', 'score']
    assert {p.name for p in (tmp_path/'r8').glob('*.png')} == {'ranking-ours-max_steps=200.png', 'ranking-ours-max_steps=30.png'}
    assert set(pd.read_csv(tmp_path/'r8'/'family_ranking.csv').cell) == {'max_steps=200', 'max_steps=30'}


# N6 ---------------------------------------------------------------------------------------------------------------
def test_systems_of_two_dataset_revisions_are_never_paired(tmp_path):
    store = mk(tmp_path/'r7.jsonl', ['A'], p={'A': .7}, **BUDGET, max_steps=200, dataset_revision='r1')
    mk(store, ['B'], p={'B': .5}, **BUDGET, max_steps=200, dataset_revision='r2')
    t = ranking.rank_store(store)
    assert t['rank'].notna().sum() == 1 and t.n_systems.max() == 1          # each alone: no paired test between them
    left = t[t['rank'].isna()].iloc[0]
    assert left.note == ('fine-tuned with dataset_revision=r1 where the systems ranked here have dataset_revision=r2: '
                         'never paired with them')
    code, text, _ = rank_cli(store)
    assert code == 0 and '#1 A' not in text and 'not ranked: A: fine-tuned with dataset_revision=r1' in text, text


def test_a_family_of_datasets_each_at_its_own_revision_is_ranked_as_one(tmp_path):
    "Each dataset has its own revision: the family ranks every system over both, as before revisions were recorded."
    store = mk(tmp_path/'r.jsonl', ['A', 'B'], p={'A': .9, 'B': .5}, **BUDGET, max_steps=200, dataset_revision='sst2@1')
    rows = [dict(r, dataset='mnli_m', dataset_revision='mnli@7') for r in res.read_rows(store)]
    for r in rows: r['test_scores_i'] = res.read_examples(store)[res.run_key(dict(r, dataset='sst2'))]
    with res.StoreWriter(store) as w: w.append([{k: v for k, v in r.items() if k not in ('row_id', 'writer', 'host', 'written_at')}
                                                for r in rows])
    fams = ranking.family_ranks(ranking.rank_store(store)).set_index('checkpoint')
    assert fams.loc['A', ['family_rank', 'n_datasets', 'cell']].tolist() == [1, 2, '']


# N10, N22 ---------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize('how', ['nan', 'cut'])
def test_a_damaged_or_nan_score_line_leaves_its_system_unranked_with_the_reason(tmp_path, how):
    store = mk(tmp_path/'r6.jsonl', ['A', 'B'], p={'A': .9, 'B': .5})
    f = next(res.shard_dir(store).glob('*.scores.jsonl'))
    lines = f.read_text().splitlines()
    e = json.loads(lines[1])                                     # after the header: seed 0 of A
    if how == 'nan':
        a = np.frombuffer(zlib.decompress(base64.b64decode(e['f32_zlib_b64'])), '<f4').copy(); a[0] = np.nan
        e['f32_zlib_b64'] = base64.b64encode(zlib.compress(a.tobytes())).decode()
    else: e['f32_zlib_b64'] = e['f32_zlib_b64'][:40] + 'AAAA' + e['f32_zlib_b64'][44:]
    lines[1] = json.dumps(e); f.write_text('\n'.join(lines) + '\n')
    t = ranking.rank_store(store).set_index('checkpoint')
    assert np.isnan(t.loc['A', 'rank']) and t.loc['B', 'rank'] == 1
    assert t.loc['A', 'note'].startswith(f'per-example scores that cannot be used (seed 0: {f}, line 2: ')
    code, text, _ = rank_cli(store)
    assert code == 0 and 'SC sst2: #1 B' in text and '(not ranked: A: per-example scores that cannot be used' in text


# N25 --------------------------------------------------------------------------------------------------------------
def test_a_full_disk_under_out_is_one_line_naming_the_folder(tmp_path, monkeypatch):
    store = mk(tmp_path/'r.jsonl', ['A', 'B'])
    def full(fig, folder, name): raise OSError(errno.ENOSPC, 'No space left on device')
    monkeypatch.setattr(ranking, 'save_figure', full)
    code, _, err = rank_cli(store, '--out', tmp_path/'full'/'ranking')
    assert code == 1 and err.count('\n') == 1 and 'Traceback' not in err, err
    assert err.startswith(f"error: cannot write into {tmp_path/'full'/'ranking'}: No space left on device (") and ' free of ' in err


# N26 --------------------------------------------------------------------------------------------------------------
def test_a_dollar_in_a_name_is_drawn_as_written(tmp_path):
    store = mk(tmp_path/'r9.jsonl', ['ckpt$_$x', 'b'])
    code, text, err = rank_cli(store, '--out', tmp_path/'r9')
    assert code == 0 and 'ckpt$_$x' in text and (tmp_path/'r9'/'ranking-ours.png').stat().st_size > 1000, err
    fig = ranking.fig_ranking(ranking.rank_store(store))
    assert 'ckpt$_$x' in [t.get_text() for t in fig.axes[0].get_yticklabels()]
