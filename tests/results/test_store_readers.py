"""Issue 49 (fourth fault attack), the shared reader's cases: N1 (a co-writer's link copied into a readable file),
N3 (a store inside another store's shard folder), N12 (one co-writer's unreadable shard), N13 (a loop of links),
N14 (a sparse shard read whole), N22/N10 (a damaged or non-finite score line, in the store and its health) and N23
(`results health` on a store this user may only read). Each reproduction is the attack's, made small."""
import json
import os
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

import mlmclm.base.claims as claims
import mlmclm.base.files as files
import mlmclm.results.compaction as comp
import mlmclm.results.store as res
from mlmclm.base.configs import ConfigError
from mlmclm.base.files import append_jsonl
from mlmclm.protocol.runs import work_claim_path

ROOT = Path(__file__).resolve().parents[2]


def rows(name='A', seeds=(0, 1, 2), n=20, **extra):
    rng = np.random.default_rng(len(name) + n)
    return [dict(checkpoint_name=name, dataset='sst2', family='SC', lr=1e-4, seed=k, val_score=m, test_score=m,
                 test_scores_i=a.tolist(), **extra)
            for k in seeds for a in [(rng.random(n) < .5).astype(float)] for m in [float(a.mean())]]


def store_of(path: Path, *names) -> Path:
    for name in names or ('A',):
        with res.StoreWriter(path) as w: w.append(rows(name))
    return path


def quiet(f, *a, **k):
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')
        return f(*a, **k)


# N1 ---------------------------------------------------------------------------------------------------------------
def test_compaction_never_reads_a_link_a_co_writer_planted(tmp_path):
    store = store_of(tmp_path/'f7.jsonl')
    secret = tmp_path/'private-token'
    secret.write_text('HF_TOKEN=hf_0123456789secret\n'); os.chmod(secret, 0o600)
    os.utime(secret, (1, 1))                                            # old: it would count as an abandoned shard
    link = res.shard_dir(store)/'zz.jsonl'; link.symlink_to(secret)
    out = quiet(comp.compact, store, abandoned_after_s=3600)
    assert out['rejected'] == 0 and link.is_symlink()                    # left where it is, never read
    assert not any('secret' in f.read_text() for f in res.shard_dir(store).rglob('rejected-*.txt'))
    assert 'a symbolic link to' in str(quiet(res.scan_store, store)[1][link])
    with pytest.warns(UserWarning, match='zz.jsonl: skipped 1 .*a symbolic link to .*private-token'):
        assert len(res.load_results(store)) == 3


def test_rejected_lines_are_readable_by_the_compacting_user_alone(tmp_path):
    store = store_of(tmp_path/'r.jsonl')
    shard = next(f for f in res.shard_dir(store).glob('*.jsonl') if not f.name.endswith('.scores.jsonl'))
    with open(shard, 'a') as f: f.write('garbage a co-writer wrote\n')
    os.chmod(store.parent, 0o755)
    assert quiet(comp.compact, store)['rejected'] == 1
    rejected, = res.shard_dir(store).glob('rejected-*.txt')
    assert 'garbage a co-writer wrote' in rejected.read_text() and rejected.stat().st_mode & 0o777 == 0o600


def test_a_linked_compacting_folder_is_refused_not_filled(tmp_path):
    store = store_of(tmp_path/'r.jsonl')
    elsewhere = tmp_path/'mine'; elsewhere.mkdir(); (elsewhere/'keep.jsonl').write_text('{"mine": 1}\n')
    (res.shard_dir(store)/'compacting').symlink_to(elsewhere)
    with pytest.raises(ConfigError, match='compacting is a symbolic link'): comp.compact(store)
    assert (elsewhere/'keep.jsonl').is_file() and len(quiet(res.load_results, store)) == 3   # its files are not the store's


# N3 ---------------------------------------------------------------------------------------------------------------
def test_a_store_inside_another_stores_shard_folder_is_refused(tmp_path):
    outer = store_of(tmp_path/'x3.jsonl', 'main')
    inner = tmp_path/'x3.d'/'ablation.jsonl'
    with pytest.raises(ConfigError, match=r'lies inside .*x3\.d, the shard folder of the results store .*x3\.jsonl'):
        res.StoreWriter(inner)
    with pytest.raises(ConfigError, match='the shard folder of the results store'): comp.compact(inner)
    assert sorted(set(res.load_results(outer).checkpoint_name)) == ['main']


def test_another_stores_file_among_the_shards_is_neither_read_nor_merged(tmp_path):
    outer = store_of(tmp_path/'x3.jsonl', 'main')
    inner = tmp_path/'x3.d'/'ablation.jsonl'                 # written by an earlier release, or compacted there
    for k in range(3): append_jsonl(inner, dict(rows('ablation')[0], seed=k, test_scores_i=None))
    with pytest.warns(UserWarning, match=r'ablation\.jsonl: skipped 1 .*not a shard'):
        assert sorted(set(res.load_results(outer).checkpoint_name)) == ['main']
    quiet(comp.compact, outer, abandoned_after_s=0)
    assert inner.read_text().count('\n') == 3 and len(res.read_rows(inner)) == 3   # untouched
    assert sorted(set(quiet(res.load_results, outer).checkpoint_name)) == ['main']


def test_a_shard_whose_first_write_was_torn_gets_its_header(tmp_path):
    "A writer whose first append was cut short (a full disk) writes its header again: its rows stay a shard's."
    store = tmp_path/'r.jsonl'
    w = res.StoreWriter(store)
    w.rows_file.parent.mkdir(parents=True); w.rows_file.write_text(w.header[:20])   # the torn first write
    w.append(rows(seeds=(0,))); w.close()
    assert len(res.load_results(store)) == 1


# N12, N13 ---------------------------------------------------------------------------------------------------------
def _deny(monkeypatch, path: Path):
    "The kernel's answer to another user: this one file cannot be opened (root would read it; the rule is what we test)."
    real = os.open
    def deny(p, flags, *a, **k):
        if Path(p) == path: raise PermissionError(13, 'Permission denied', str(p))
        return real(p, flags, *a, **k)
    monkeypatch.setattr(files.os, 'open', deny)


def test_one_unreadable_shard_is_named_and_the_others_read(tmp_path, monkeypatch):
    store = store_of(tmp_path/'f3.jsonl', 'A', 'B')
    theirs = sorted(f for f in res.shard_dir(store).glob('*.jsonl') if not f.name.endswith('.scores.jsonl'))[-1]
    _deny(monkeypatch, theirs)
    with pytest.warns(UserWarning, match='this user may not read it'):
        assert len(res.load_results(store)) == 3
    health = quiet(comp.store_health, store)
    assert health['unreadable'] == {str(theirs): 1} and health['shards'] == {'closed': 1, 'unreadable': 1}
    quiet(comp.compact, store, abandoned_after_s=0)
    assert theirs.is_file()                                    # not taken: never moved, never deleted


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which('setpriv'), reason='needs root to act as a reader without its rights')
def test_one_unreadable_shard_for_real(tmp_path):
    store = store_of(tmp_path/'f3.jsonl', 'A', 'B')
    theirs = sorted(f for f in res.shard_dir(store).glob('*.jsonl') if not f.name.endswith('.scores.jsonl'))[-1]
    os.chown(theirs, 65534, 65534); os.chmod(theirs, 0o600)
    code = (f"import warnings; warnings.simplefilter('ignore'); import mlmclm.results.store as r, mlmclm.results.compaction as c\n"
            f"print(len(r.load_results({str(store)!r})), c.store_health({str(store)!r})['shards'])")
    out = subprocess.run(['setpriv', '--bounding-set', '-dac_override,-dac_read_search,-fowner', '--', sys.executable, '-c', code],
                         capture_output=True, text=True, cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)), timeout=120)
    assert out.returncode == 0 and out.stdout.split('\n')[0].startswith("3 {'closed': 1, 'unreadable': 1}"), out.stderr[-2000:]


def test_a_loop_of_links_among_the_shards_stops_no_reader(tmp_path):
    store = store_of(tmp_path/'f2.jsonl')
    loop = res.shard_dir(store)/'loop.jsonl'; loop.symlink_to('loop.jsonl')
    with pytest.warns(UserWarning, match='loop.jsonl: skipped 1 .*a symbolic link to loop.jsonl, a loop of links'):
        assert len(res.load_results(store)) == 3
    assert 'loop.jsonl' in comp.describe_health(quiet(comp.store_health, store))
    quiet(comp.compact, store, abandoned_after_s=0)
    assert loop.is_symlink() and len(quiet(res.load_results, store)) == 3


# N14 --------------------------------------------------------------------------------------------------------------
def test_a_sparse_shard_costs_a_reader_no_memory(tmp_path):
    store = store_of(tmp_path/'f5.jsonl')
    huge = res.shard_dir(store)/'zz.jsonl'
    with open(huge, 'wb') as f: f.truncate(256 << 20)         # 256 MiB of zeros, no disk space
    code = ('import resource, warnings; warnings.simplefilter("ignore"); import mlmclm.results.store as r\n'
            'before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n'
            f'rows, problems = r.scan_store({str(store)!r})\n'
            'print(len(rows), (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) // 1024, problems)')
    out = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, cwd=ROOT,
                         env=dict(os.environ, PYTHONPATH=str(ROOT)), timeout=300)
    n, grown, problems = out.stdout.split(' ', 2)
    assert out.returncode == 0 and n == '3', out.stderr[-2000:]
    assert int(grown) < 64, f'reading a 256 MiB sparse shard grew the peak memory by {grown} MiB'   # read whole: 512 MiB
    assert 'line 1: longer than 16,777,216 bytes, not read' in problems


# N22, N10 ---------------------------------------------------------------------------------------------------------
def _damage(store: Path, how: str) -> Path:
    "Rewrite the second line of the store's scores shard: its payload cut (`cut`) or its first score NaN (`nan`)."
    import base64, zlib
    f = next(res.shard_dir(store).glob('*.scores.jsonl'))
    lines = f.read_text().splitlines()
    e = json.loads(lines[1])
    if how == 'cut': e['f32_zlib_b64'] = e['f32_zlib_b64'][:12] + 'AAAA' + e['f32_zlib_b64'][16:]
    else:
        a = np.frombuffer(zlib.decompress(base64.b64decode(e['f32_zlib_b64'])), '<f4').copy(); a[0] = np.nan
        e['f32_zlib_b64'] = base64.b64encode(zlib.compress(a.tobytes())).decode()
    lines[1] = json.dumps(e); f.write_text('\n'.join(lines) + '\n')
    return f


@pytest.mark.parametrize('how', ['cut', 'nan'])
def test_a_damaged_score_line_is_named_counted_and_kept_named(tmp_path, how):
    store = store_of(tmp_path/'r10.jsonl')
    f = _damage(store, how)
    examples, damaged = res.scan_examples(store)
    key, = damaged
    assert len(examples) == 2 and key not in examples and damaged[key].startswith(f'{f}, line 2: ')
    with pytest.warns(UserWarning, match=r'per-example test scores of 1 run\(s\) cannot be used'): res.read_examples(store)
    h = quiet(comp.store_health, store)
    assert h['damaged_scores'] == {str(f): 1} and 'cannot be used' in comp.describe_health(h)
    quiet(comp.compact, store)                                  # merged as it is: still named, now in the main scores file
    examples, damaged = res.scan_examples(store)
    assert len(examples) == 2 and damaged[key].startswith(f"{store.with_suffix('.scores.jsonl')}, line ")


# N23 --------------------------------------------------------------------------------------------------------------
def test_health_of_a_store_this_user_may_only_read(tmp_path, monkeypatch):
    store = store_of(tmp_path/'p3.jsonl')
    p = work_claim_path(store, 'a run'); p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(json.dumps(dict(host='node-7', pid=1234, started='2026-11-28T00:00:00Z', lease_s=1800)) + '\n')
    def read_only(folder): raise PermissionError(13, 'Permission denied', f'{folder}/.clock-x')   # fs_now's probe file
    monkeypatch.setattr(claims, 'fs_now', read_only)
    h = comp.store_health(store)
    assert h['claims'] == {'age unknown': 1} and h['runs'] == 3
    assert 'their age is unknown' in comp.describe_health(h)
    assert comp.main(['health', str(store)]) is None           # the report, not an error


# what a user names is still read through its links -----------------------------------------------------------------
def test_a_checkpoint_in_a_hub_cache_and_a_linked_table_are_read_through_their_links(tmp_path):
    "A hub cache's snapshot holds links into its blobs: the checkpoint's identity reads them, as that of a copy."
    copy, blobs, snap = tmp_path/'copy', tmp_path/'blobs', tmp_path/'snapshots'/'abc'
    for d in (copy, blobs, snap): d.mkdir(parents=True)
    for name, data in (('config.json', b'{"hidden_size": 8}'), ('model.safetensors', bytes(range(256)) * 300)):
        (copy/name).write_bytes(data); (blobs/name).write_bytes(data); (snap/name).symlink_to(blobs/name)
    assert res.checkpoint_identity(str(snap)) == res.checkpoint_identity(str(copy))
    table = tmp_path/'t.csv'; table.write_text('checkpoint_name,dataset,seed\nm,sst2,0\n')
    (tmp_path/'mine.csv').symlink_to(table)
    assert res.read_results(tmp_path/'mine.csv').seed.tolist() == [0]
