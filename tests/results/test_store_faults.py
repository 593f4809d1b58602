"""Fault injection on the results store (issue 15): SIGKILL of a fine-tuning sweep and of an import mid-way, concurrent
sweeps and writers on one store, a compaction killed or racing writers, writes failing with ENOSPC / EIO / EFBIG, and
bad inputs to fine-tuning, import and figures. After every fault: no row lost, none duplicated, nothing finished
redone. Pretraining's faults are in tests/pretraining/test_loop_faults.py.

The second attack (issue 27, at the end): per-example scores kept by compaction, a compaction frozen past its lease,
rows appended to the main file by an earlier release's writer, keys beginning with '_', forced re-runs on a host
whose clock is off, a symlinked store, duplicates counted as seeds, rows that do not count toward the paper's
families (issue 26), and what used to crash: a numeric `written_at`, a dangling symlink or a non-UTF-8 name among
the shards, a claim whose `lease_s` is not a number, the claims folder removed under running workers, a run folder
the store would refuse (`lr0_sd0`).

The third attack (issue 34, last): a FIFO, a link to /dev/zero or a huge file among the shards or claims never
hangs or eats a reader."""
import errno
import json
import os
import random
import re
import signal
import subprocess
import sys
import time
import warnings
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch

import mlmclm.finetuning.loop as ft

import mlmclm.finetuning.sweep as sw
from mlmclm.protocol.runs import FinetuneConfig
import mlmclm.results.paper_runs as pr
from fake_encodeval import write_fixture_tree
from result_rows import row, store_with_rows
from waiting import finishes
import mlmclm.results.store as res
import mlmclm.results.compaction as comp
import mlmclm.results.aggregation as aggr
from mlmclm.base.configs import ConfigError, build_config
from mlmclm.base.files import WriteError, project_root
from mlmclm.results.store import load_results, read_rows
from mlmclm.protocol.runs import run_key
from mlmclm.protocol.runs import FinetuneRun, claim_work, work_claim_path
from mlmclm import core
from mlmclm.base.claims import try_claim

ROOT = project_root()
ENV = dict(os.environ, HF_HUB_OFFLINE='1', HF_DATASETS_OFFLINE='1', MPLBACKEND='Agg', TOKENIZERS_PARALLELISM='false',
           OMP_NUM_THREADS='1', PYTHONPATH=str(ROOT))
SHARD_ROWS = r'\.d/(compacting/)?[^/]+(?<!\.scores)\.jsonl$'   # a writer's shard of rows

# A worker run in a subprocess: the sweep (or an import) with an optional fault: SIGKILL of itself in the middle of
# its Nth write to a shard (half the bytes written: a torn line), or a file-size limit (`ulimit -f`).
WORKER = r'''
import json, os, re, resource, signal, sys
import mlmclm.base.files as core
job = json.loads(sys.argv[1])
if job.get('kill_at_write'):
    real, n = core.write_all, [0]
    def torn(fd, data):
        if re.search(job['kill_path'], os.readlink(f'/proc/self/fd/{fd}')):
            n[0] += 1
            if n[0] == job['kill_at_write']:
                real(fd, data[:len(data) // 2]); os.kill(os.getpid(), signal.SIGKILL)
        real(fd, data)
    core.write_all = torn
if job.get('fsize'):
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)            # so the kernel answers EFBIG instead of killing us
    resource.setrlimit(resource.RLIMIT_FSIZE, (job['fsize'], job['fsize']))
if job['what'] == 'sweep':
    import torch; torch.set_num_threads(1)
    import mlmclm.finetuning.sweep as sw
    from mlmclm.protocol.runs import FinetuneConfig
    sw.finetune_sweep(FinetuneConfig(**job['cfg']))
elif job['what'] == 'import':
    from mlmclm.results.paper_runs import main
    main(['import', job['tree'], '--results', job['store']] + job.get('args', []))
else:                                                        # claim-protected fake work: the sweep's protocol, no torch
    import time
    from mlmclm.results.store import StoreWriter, missing
    from mlmclm.protocol.runs import FinetuneRun, claim_work
    units = [(f"ck{u % 2}", 'sst2', 1e-4, u) for u in range(job['units'])]
    units = units[job['rotate']:] + units[:job['rotate']]
    for ck, ds, lr, seed in units:
        run = FinetuneRun(ck, ds, (ds,), lr, seed)
        with claim_work(job['store'], run.work, lease_s=60) as mine:
            if not mine or not missing(job['store'], [run], warn=False): continue
            time.sleep(0.005)
            with StoreWriter(job['store'], note=job['who']) as w:   # a short-lived writer per row: many closed shards
                w.append([dict(checkpoint_name=ck, dataset=ds, family='SC', lr=lr, seed=seed, val_score=.5,
                               test_score=.5, worker=job['who'])])
'''


pytestmark = pytest.mark.usefixtures('one_thread')   # tiny models: one thread is faster (conftest.py)


@pytest.fixture
def worker(tmp_path):
    script = tmp_path/'worker.py'
    script.write_text(WORKER)
    def start(job: dict) -> subprocess.Popen:
        return subprocess.Popen([sys.executable, str(script), json.dumps(job)], cwd=ROOT, env=ENV,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return start


def sweep_cfg(store, **kw) -> dict:
    "Six tiny fine-tuning runs (one task, 2 LRs x 3 seeds, one step each)."
    return dict(dict(tasks='rt_sentiment', lrs='1e-3,2e-3', seeds='0,1,2', max_steps=1, eval_every=1, batch_size=4,
                     micro_batch_size=4, max_eval_examples=4, results=str(store), progress=False), **kw)


def expected_keys(name, lrs=(1e-3, 2e-3), seeds=(0, 1, 2), dataset='rt_sentiment'):
    return {run_key(dict(checkpoint_name=name, dataset=dataset, lr=lr, seed=s)) for lr in lrs for s in seeds}


def stored(store) -> Counter:
    "How many complete rows each run has on disk (not deduplicated)."
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')
        return Counter(run_key(r) for r in read_rows(store, warn=False))


def row_ids(store) -> dict:
    return {r['row_id']: r for r in read_rows(store, warn=False) if 'row_id' in r}


def assert_each_once(store, keys):
    counts = stored(store)
    assert set(counts) == set(keys), (set(keys) - set(counts), set(counts) - set(keys))
    assert max(counts.values()) == 1, {k: n for k, n in counts.items() if n > 1}


# ---------------------------------------------------------------- SIGKILL, then rerun
def test_sweep_killed_in_the_middle_of_a_row_write_resumes_exactly(tmp_path, worker):
    store = tmp_path/'results.jsonl'
    p = worker(dict(what='sweep', cfg=sweep_cfg(store), kill_at_write=3, kill_path=SHARD_ROWS))
    p.communicate(timeout=600)
    assert p.returncode == -signal.SIGKILL
    before = row_ids(store)
    assert len(before) == 2                                     # two rows landed, the third is torn
    assert list((store.with_suffix('.d')/'claims').glob('*.claim')), 'the killed worker left its claim behind'
    sw.finetune_sweep(FinetuneConfig(**sweep_cfg(store)))    # the rerun takes over the dead worker's claim
    after = row_ids(store)
    assert all(after[i] == r for i, r in before.items())        # nothing lost or changed
    assert_each_once(store, expected_keys('tiny-random'))       # none duplicated, nothing finished redone
    assert not list((store.with_suffix('.d')/'claims').glob('*.claim'))


@pytest.mark.slow
@pytest.mark.parametrize('point', range(5))
def test_sweep_killed_at_a_random_moment_resumes_exactly(tmp_path, worker, point):
    rng = random.Random(point)
    store = tmp_path/'results.jsonl'
    p = worker(dict(what='sweep', cfg=sweep_cfg(store)))
    rows, deadline = rng.choice([0, 1, 2, 3, 5]), time.time() + 600   # let this many rows land, then a random moment
    while time.time() < deadline and p.poll() is None and len(stored(store)) < rows: time.sleep(0.05)
    time.sleep(rng.uniform(0, 1.5))
    p.send_signal(signal.SIGKILL); p.communicate()
    before = row_ids(store)
    sw.finetune_sweep(FinetuneConfig(**sweep_cfg(store)))
    assert all(row_ids(store)[i] == r for i, r in before.items())
    assert_each_once(store, expected_keys('tiny-random'))
    print(f'killed after {len(before)} of 6 rows')


def test_import_killed_mid_write_resumes_exactly(tmp_path, worker):
    write_fixture_tree(tmp_path/'E')                         # 48 good files, 3 bad
    store = tmp_path/'results.jsonl'
    p = worker(dict(what='import', tree=str(tmp_path/'E'), store=str(store), args=['--batch', '10'],
                    kill_at_write=3, kill_path=SHARD_ROWS))
    p.communicate(timeout=300)
    assert p.returncode == -signal.SIGKILL
    before = row_ids(store)
    assert 20 <= len(before) < 30                               # two batches of 10, and the complete lines of the torn one
    report = pr.import_tree(tmp_path/'E', store, progress=False)
    assert (report['imported'], report['already_there'], len(report['skipped'])) == (48 - len(before), len(before), 3)
    assert all(row_ids(store)[i] == r for i, r in before.items())
    assert len(stored(store)) == 48 and max(stored(store).values()) == 1
    assert len(res.read_examples(store)) == 48                  # per-example scores of every run, killed or not


# ---------------------------------------------------------------- concurrent workers on one store
def test_two_concurrent_sweeps_on_one_checkpoint_do_each_run_once(tmp_path, worker):
    store = tmp_path/'results.jsonl'
    procs = [worker(dict(what='sweep', cfg=sweep_cfg(store))) for _ in range(2)]
    for p in procs:
        out, err = p.communicate(timeout=900)
        assert p.returncode == 0, err[-3000:]
    assert_each_once(store, expected_keys('tiny-random'))


@pytest.mark.slow
def test_four_concurrent_sweeps_on_two_checkpoints_do_each_run_once(tmp_path, worker):
    from tiny import tiny_checkpoint
    cks = [tiny_checkpoint(tmp_path/'run'/'checkpoints'/f'step-{s}', step=s, seed=s) for s in (10, 20)]
    store = tmp_path/'results.jsonl'
    procs = [worker(dict(what='sweep', cfg=sweep_cfg(store, checkpoint=str(ck)))) for ck in cks for _ in range(2)]
    for p in procs:
        out, err = p.communicate(timeout=1800)
        assert p.returncode == 0, err[-3000:]
    assert_each_once(store, expected_keys('r-step-10') | expected_keys('r-step-20'))


@pytest.mark.parametrize('n_workers', [2, 4])
def test_concurrent_claimed_workers_do_each_unit_once(tmp_path, worker, n_workers):
    store = tmp_path/'results.jsonl'
    procs = [worker(dict(what='fake', store=str(store), units=40, rotate=i * 7, who=f'w{i}')) for i in range(n_workers)]
    for p in procs:
        out, err = p.communicate(timeout=600)
        assert p.returncode == 0, err[-3000:]
    keys = {run_key(dict(checkpoint_name=f'ck{u % 2}', dataset='sst2', lr=1e-4, seed=u)) for u in range(40)}
    assert_each_once(store, keys)
    assert len({r['worker'] for r in read_rows(store)}) > 1    # the work really was shared


def test_compaction_while_writers_run_loses_nothing(tmp_path, worker):
    store = tmp_path/'results.jsonl'
    procs = [worker(dict(what='fake', store=str(store), units=60, rotate=i * 20, who=f'w{i}')) for i in range(3)]
    compactions = 0
    while any(p.poll() is None for p in procs):
        with warnings.catch_warnings():
            warnings.simplefilter('ignore')
            comp.compact(store); compactions += 1
        time.sleep(0.02)
    for p in procs:
        out, err = p.communicate()
        assert p.returncode == 0, err[-3000:]
    comp.compact(store)
    assert compactions >= 2
    keys = {run_key(dict(checkpoint_name=f'ck{u % 2}', dataset='sst2', lr=1e-4, seed=u)) for u in range(60)}
    assert_each_once(store, keys)
    assert list(store.with_suffix('.d').glob('*.jsonl')) == []  # everything merged into the main file


def test_a_compaction_killed_midway_loses_nothing_and_the_next_one_finishes(tmp_path, monkeypatch):
    store = tmp_path/'results.jsonl'
    rows = [dict(checkpoint_name='m', dataset='sst2', family='SC', lr=1e-4, seed=s, val_score=.5, test_score=.5) for s in range(6)]
    for r in rows:
        with res.StoreWriter(store) as w: w.append([dict(r, test_scores_i=[1, 0])])
    def killed(*a, **k): raise KeyboardInterrupt('killed after moving the shards')
    monkeypatch.setattr(comp, '_merge', killed)
    with pytest.raises(KeyboardInterrupt): comp.compact(store)
    assert len(list((store.with_suffix('.d')/'compacting').glob('*.jsonl'))) == 12   # moved, not yet merged
    assert len(load_results(store)) == 6 and len(res.read_examples(store)) == 6       # readers still see them all
    monkeypatch.undo()
    comp.compact(store)                                          # the compact claim of the "killed" one was released
    assert len(load_results(store)) == 6 and len(res.read_examples(store)) == 6
    assert max(stored(store).values()) == 1


# ---------------------------------------------------------------- writes that fail
def fail_writes(monkeypatch, call: str, err: int, nth: int, pattern: str = SHARD_ROWS):
    "Make `os.<call>` fail with `err` from its `nth` use on a file matching `pattern`."
    real, n = getattr(os, call), [0]
    def failing(fd, *a):
        try: target = os.readlink(f'/proc/self/fd/{fd}')
        except OSError: target = ''
        if re.search(pattern, target):
            n[0] += 1
            if n[0] >= nth: raise OSError(err, os.strerror(err))
        return real(fd, *a)
    monkeypatch.setattr(os, call, failing)


def test_disk_full_during_a_sweep_names_the_file_and_keeps_earlier_rows(tmp_path, monkeypatch):
    store = tmp_path/'results.jsonl'
    cfg = FinetuneConfig(**sweep_cfg(store, seeds='0,1'))
    fail_writes(monkeypatch, 'write', errno.ENOSPC, nth=2)
    with pytest.raises(WriteError, match=r'No space left on device: could not append to .*results\.d/.*\.jsonl; '
                                         r'the rows written before are intact') as e:
        sw.finetune_sweep(cfg)
    assert e.value.errno == errno.ENOSPC
    assert len(stored(store)) == 1                              # the first run's row, intact
    monkeypatch.undo()                                          # space freed
    sw.finetune_sweep(cfg)
    assert_each_once(store, expected_keys('tiny-random', seeds=(0, 1)))


def test_io_error_on_fsync_during_an_import_names_the_file_and_keeps_earlier_rows(tmp_path, monkeypatch):
    write_fixture_tree(tmp_path/'E')
    store = tmp_path/'results.jsonl'
    fail_writes(monkeypatch, 'fsync', errno.EIO, nth=3)
    with pytest.raises(WriteError, match=r'Input/output error: could not append to .*results\.d/'):
        pr.import_tree(tmp_path/'E', store, progress=False, batch=10)
    assert len(stored(store)) >= 20                             # the batches before the failing one
    monkeypatch.undo()
    pr.import_tree(tmp_path/'E', store, progress=False)
    assert len(stored(store)) == 48 and max(stored(store).values()) == 1


def test_file_size_limit_during_an_import_is_a_clear_error_and_a_rerun_completes(tmp_path, worker):
    write_fixture_tree(tmp_path/'E')
    store = tmp_path/'results.jsonl'
    p = worker(dict(what='import', tree=str(tmp_path/'E'), store=str(store), args=['--batch', '10'], fsize=12_000))
    out, err = p.communicate(timeout=300)
    assert p.returncode == 2, (out, err)
    assert 'error: [Errno 27] File too large: could not append to' in err and 'results.d/' in err
    assert 'Traceback' not in err
    before = row_ids(store)
    assert 10 <= len(before) < 48
    pr.import_tree(tmp_path/'E', store, progress=False)
    assert all(row_ids(store)[i] == r for i, r in before.items())
    assert len(stored(store)) == 48 and max(stored(store).values()) == 1


# ---------------------------------------------------------------- bad inputs
def _tree(tmp_path, text: bytes | str, dataset='sst2', family='SC') -> Path:
    run = tmp_path/'results'/'610m-clm-42k'/family/dataset/'lr1e-04_sd0'; run.mkdir(parents=True)
    (run/'results.json').write_bytes(text.encode() if isinstance(text, str) else text)
    return tmp_path


def _skip_reason(tmp_path, text, **kw) -> str:
    "The importer's reason for skipping the one file of a tree (it must skip it)."
    report = pr.import_tree(_tree(tmp_path, text, **kw), tmp_path/'r.jsonl', progress=False)
    assert report['imported'] == 0 and len(report['skipped']) == 1, report
    return f"{report['skipped'][0]['path']}: {report['skipped'][0]['reason']}"


def _finetune(tmp_path, monkeypatch, **kw):
    "Run a sweep whose expensive part (loading the model) must never be reached."
    def expensive(*a, **k): raise AssertionError('a bad input reached the expensive part')
    monkeypatch.setattr(ft, '_load_base', expensive)
    sw.finetune_sweep(build_config(FinetuneConfig, dict(sweep_cfg(tmp_path/'r.jsonl'), **kw)))


def _figures(tmp_path, capsys, results, *extra):
    from mlmclm.report.render import main
    with pytest.raises(SystemExit): main(['--results', str(results), '--out', str(tmp_path/'f'), *extra])
    return capsys.readouterr().err


def _store(tmp_path, text: bytes) -> Path:
    (tmp_path/'s.jsonl').write_bytes(text); return tmp_path/'s.jsonl'


BAD_INPUTS = [   # (case, how to provoke it, what the message must say)
    ('ft lrs infinite', lambda t, m, c: _finetune(t, m, lrs='1e-4,inf'), "lrs='1e-4,inf' holds inf; learning rates are numbers in (0, 1]"),
    ('ft lrs NaN', lambda t, m, c: _finetune(t, m, lrs='nan'), "lrs='nan' holds nan; learning rates are numbers in (0, 1]"),
    ('ft lrs not numbers', lambda t, m, c: _finetune(t, m, lrs='1e-4,fast'), "lrs='1e-4,fast' must be a comma list of numbers"),
    ('ft lrs negative', lambda t, m, c: _finetune(t, m, lrs='-1e-3'), "lrs='-1e-3' holds -0.001; learning rates are numbers in (0, 1]"),
    ('ft seeds fractional', lambda t, m, c: _finetune(t, m, seeds='0,0.7'), "seeds='0,0.7' holds 0.7; seeds are whole numbers in [0, 4294967295]"),
    ('ft seeds negative', lambda t, m, c: _finetune(t, m, seeds='-1'), "seeds='-1' holds -1; seeds are whole numbers in [0, 4294967295]"),
    ('ft max_steps zero', lambda t, m, c: _finetune(t, m, max_steps=0), 'max_steps=0 is out of range; allowed: >= 1'),
    ('ft batch_size a word', lambda t, m, c: _finetune(t, m, batch_size='big'), "batch_size='big' has type str; expected int"),
    ('ft attention unknown', lambda t, m, c: _finetune(t, m, attention='sideways'), "attention='sideways' is not allowed; choose one of"),
    ('ft unknown task', lambda t, m, c: _finetune(t, m, tasks='rt_sentiment,ner'), "unknown task 'ner'"),
    ('ft missing checkpoint', lambda t, m, c: _finetune(t, m, checkpoint=str(t/'nope')), 'does not exist'),
    ('ft results is a CSV', lambda t, m, c: _finetune(t, m, results=str(t/'r.csv')), "r.csv' names a CSV table; a results store is JSON lines: give a path ending in .jsonl"),
    ('ft results is .json', lambda t, m, c: _finetune(t, m, results=str(t/'r.json')), "names a '.json' file; a results store is JSON lines"),
    ('ft batch not a multiple', lambda t, m, c: _finetune(t, m, batch_size=6), 'batch_size=6 must be a multiple of micro_batch_size=4'),
    ('import empty tree', lambda t, m, c: pr.import_tree(t, t/'r.jsonl'), 'no results.json found under'),
    ('import not a folder', lambda t, m, c: pr.import_tree(t/'nope', t/'r.jsonl'), 'nope is not a folder'),
    ('import into a CSV', lambda t, m, c: pr.import_tree(t, t/'r.csv'), "r.csv' names a CSV table"),
    ('import score true', lambda t, m, c: _skip_reason(t, '{"validation": {"score": 0.5}, "test": {"score": true}}'), 'test score is true, a boolean; expected a number in [0, 1]'),
    ('import score a string', lambda t, m, c: _skip_reason(t, '{"validation": {"score": "0.7"}, "test": {"score": 0.5}}'), "validation score is the string '0.7'"),
    ('import score NaN', lambda t, m, c: _skip_reason(t, '{"validation": {"score": NaN}, "test": {"score": 0.5}}'), 'validation score is nan; expected a number in [0, 1]'),
    ('import score above 1', lambda t, m, c: _skip_reason(t, '{"validation": {"score": 70.2}, "test": {"score": 0.5}}'), 'validation score is 70.2; expected a number in [0, 1]'),
    ('import truncated file', lambda t, m, c: _skip_reason(t, '{"validation": {"score": 0.5}, "te'), 'malformed results.json (invalid JSON'),
    ('import non-UTF-8 file', lambda t, m, c: _skip_reason(t, b'{"validation": {"score": 0.5}}\xff\xfe'), 'results.json is not UTF-8'),
    ('import NaN per-example', lambda t, m, c: _skip_reason(t, '{"validation": {"score": 0.5}, "test": {"score": 0.5, "scores_i": [1, NaN]}}'), 'test scores_i is not a list of finite numbers'),
    ('import unknown dataset', lambda t, m, c: _skip_reason(t, '{"validation": {"score": 0.5}, "test": {"score": 0.5}}', dataset='SST2'), "unknown dataset 'SST2' for family SC; expected one of ['sst2'"),
    ('figures missing store', lambda t, m, c: _figures(t, c, t/'none.jsonl'), 'none.jsonl do not exist'),
    ('figures store of garbage', lambda t, m, c: _figures(t, c, _store(t, b'{"checkpoint_name": "m", "lr": "x"}\n\xff\n')), 'no results to draw in'),
    ('figures non-UTF-8 CSV', lambda t, m, c: _figures(t, c, _store(t, b'a,b\n\xff\xfe,1\n').rename(t/'s.csv')), 'cannot read results'),
    ('figures CSV without scores', lambda t, m, c: _figures(t, c, _store(t, b'checkpoint_name,dataset\nm,sst2\n').rename(t/'s.csv')), "lacks the columns ['family', 'lr', 'seed', 'val_score', 'test_score']"),
    ('figures unknown selection', lambda t, m, c: _figures(t, c, t/'r.jsonl', '--selection', 'best'), "argument --selection: invalid choice: 'best'"),
    ('figures unknown scale', lambda t, m, c: _figures(t, c, t/'r.jsonl', '--scale', 'huge'), "argument --scale: invalid choice: 'huge'"),
]


@pytest.mark.parametrize('case, provoke, message', BAD_INPUTS, ids=[b[0] for b in BAD_INPUTS])
def test_bad_inputs_fail_early_with_a_clear_message(tmp_path, monkeypatch, capsys, case, provoke, message):
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')
        try: text = provoke(tmp_path, monkeypatch, capsys)
        except (ConfigError, FileNotFoundError) as e: text = str(e)
    assert message in (text or ''), f'{case}: {text!r}'
    assert 'Traceback' not in (text or '')


def test_a_reader_whose_listing_a_compaction_overtook_reads_again_and_misses_nothing(tmp_path, monkeypatch):
    # the race behind a duplicated run: a reader lists the shards, a compaction moves one into compacting/ before the
    # reader opens it, and the main file does not hold its rows yet; the reader must notice and read again
    store = tmp_path/'results.jsonl'
    row = dict(checkpoint_name='m', dataset='sst2', family='SC', lr=1e-4, seed=0, val_score=.5, test_score=.5)
    with res.StoreWriter(store) as w: w.append([row])
    stale = res.row_files(store)                               # listed before the compaction moved the shard
    def killed(*a, **k): raise KeyboardInterrupt('killed after moving the shards')
    monkeypatch.setattr(comp, '_merge', killed)
    with pytest.raises(KeyboardInterrupt): comp.compact(store)
    monkeypatch.undo()
    listings = [stale]
    real = res.row_files
    monkeypatch.setattr(res, 'row_files', lambda s: listings.pop() if listings else real(s))
    assert [r['seed'] for r in read_rows(store)] == [0]


# ================================================================ second fault attack (issue 27)
def quietly(f, *a, **k):
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')
        return f(*a, **k)


# ---------------------------------------------------------------- 27.1: compaction keeps every per-example score
def test_compact_keeps_the_validation_and_test_scores_of_every_run(tmp_path):
    write_fixture_tree(tmp_path/'E')
    store = tmp_path/'results.jsonl'
    pr.import_tree(tmp_path/'E', store, progress=False)
    before = {s: res.read_examples(store, s) for s in ('val', 'test')}
    assert len(before['val']) == len(before['test']) == 48
    comp.compact(store)
    after = {s: res.read_examples(store, s) for s in ('val', 'test')}
    for s in before:
        assert sorted(after[s]) == sorted(before[s]), s
        assert all(np.array_equal(after[s][k], before[s][k]) for k in before[s]), s
    boot = aggr.bootstrap_intervals(load_results(store), after['test'])
    assert boot.boot_low.notna().all()


# ---------------------------------------------------------------- 27.2: a compaction frozen past its lease
FROZEN_COMPACTION = r'''
import os, signal, sys
from contextlib import contextmanager
import mlmclm.base.claims as claims
claims.HOST = 'frozen-host'                 # its claim looks like another host's: the lease decides when it is stale
import mlmclm.results.compaction as comp
real_claim, real_atomic, frozen = comp.claim, comp.atomic_path, []
comp.claim = lambda path, lease_s=1800.0, note='': real_claim(path, lease_s=1, note=note)
@contextmanager
def freezing(path, *a, **k):              # frozen (SIGSTOP) after reading everything, before writing the main file
    if not frozen: frozen.append(path); os.kill(os.getpid(), signal.SIGSTOP)
    with real_atomic(path, *a, **k) as tmp: yield tmp
comp.atomic_path = freezing
comp.compact(sys.argv[1])
'''


def _stopped(pid: int) -> bool:
    return Path(f'/proc/{pid}/stat').read_text().rsplit(')', 1)[1].split()[0] == 'T'


def test_a_compaction_frozen_past_its_lease_does_not_overwrite_the_one_that_took_over(tmp_path, monkeypatch):
    store = tmp_path/'results.jsonl'
    for s in range(10):
        with res.StoreWriter(store) as w: w.append([row(seed=s)])
    (tmp_path/'compactor.py').write_text(FROZEN_COMPACTION)
    p = subprocess.Popen([sys.executable, str(tmp_path/'compactor.py'), str(store)], cwd=ROOT, env=ENV,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 120
        while not _stopped(p.pid):
            assert p.poll() is None and time.time() < deadline, p.communicate()
            time.sleep(0.05)
        for s in range(10, 15):
            with res.StoreWriter(store) as w: w.append([row(seed=s)])
        time.sleep(1.5)                                         # its claim (lease 1 s) is stale now
        real_claim = comp.claim
        monkeypatch.setattr(comp, 'claim', lambda path, lease_s=1800.0, note='': real_claim(path, lease_s=1, note=note))
        comp.compact(store)                                      # takes over and merges all 15 rows
        monkeypatch.undo()
        assert sorted(load_results(store).seed) == list(range(15))
    finally:
        p.send_signal(signal.SIGCONT)
    out, err = p.communicate(timeout=120)
    assert sorted(load_results(store).seed) == list(range(15)), err[-2000:]
    assert p.returncode != 0 and 'lost its claim' in err, err[-2000:]
    comp.compact(store)
    assert sorted(load_results(store).seed) == list(range(15))
    assert max(stored(store).values()) == 1


# ---------------------------------------------------------------- 27.3: rows appended to the main file directly
def test_rows_appended_to_the_main_file_while_compact_runs_are_kept(tmp_path, monkeypatch):
    from mlmclm.base.files import append_jsonl
    store = tmp_path/'results.jsonl'
    append_jsonl(store, row(seed=0))                            # a store of the previous release: rows in the main file
    with res.StoreWriter(store) as w: w.append([row(seed=1)])
    real = os.replace
    def appended_meanwhile(src, dst, *a, **k):                  # an earlier release's writer appends just before
        if Path(dst).name == 'results.jsonl': append_jsonl(store, row(seed=2))   # the main file is replaced
        return real(src, dst, *a, **k)
    monkeypatch.setattr(os, 'replace', appended_meanwhile)
    with pytest.warns(UserWarning, match='appended to .*results.jsonl directly'):
        comp.compact(store)
    monkeypatch.undo()
    assert sorted(load_results(store).seed) == [0, 1, 2]
    comp.compact(store)
    assert sorted(load_results(store).seed) == [0, 1, 2] and max(stored(store).values()) == 1
    assert list(store.with_suffix('.d').glob('*.jsonl')) == []


APPENDER = r'''
import sys, time
from mlmclm.base.files import append_jsonl
for s in range(int(sys.argv[2])):
    append_jsonl(sys.argv[1], dict(checkpoint_name='old', dataset='sst2', family='SC', lr=1e-4, seed=s, val_score=.5,
                                   test_score=.5))
    time.sleep(0.002)
'''


@pytest.mark.slow
def test_an_earlier_release_appending_to_the_main_file_loses_nothing_to_compactions(tmp_path):
    store = tmp_path/'results.jsonl'
    (tmp_path/'appender.py').write_text(APPENDER)
    p = subprocess.Popen([sys.executable, str(tmp_path/'appender.py'), str(store), '400'], cwd=ROOT, env=ENV)
    compactions = 0
    while p.poll() is None:
        with res.StoreWriter(store) as w: w.append([row(ck='new', seed=compactions)])
        quietly(comp.compact, store); compactions += 1
    assert p.wait() == 0 and compactions >= 12
    quietly(comp.compact, store)
    assert len(load_results(store).query("checkpoint_name == 'old'")) == 400
    assert len(load_results(store).query("checkpoint_name == 'new'")) == compactions


# ---------------------------------------------------------------- 27.4: keys beginning with '_'
def test_a_key_beginning_with_an_underscore_is_refused_at_write_and_never_taken_for_a_header(tmp_path):
    from mlmclm.base.files import append_jsonl
    store = tmp_path/'results.jsonl'
    with res.StoreWriter(store) as w:
        with pytest.raises(ValueError, match=r"\['_note'\].*begin with '_'"): w.append([row(_note='x')])
        w.append([row(seed=0)])
    append_jsonl(store, row(seed=1, _note='an older writer'))   # rows, not headers: only {'_writer': ..} and
    append_jsonl(store, row(seed=2, _closed='no'))              # {'_closed': ..} alone on their line are headers
    assert sorted(load_results(store).seed) == [0, 1, 2]
    comp.compact(store)
    assert sorted(load_results(store).seed) == [0, 1, 2]
    shard = store.with_suffix('.d')/'x.jsonl'                   # a row with a `_closed` key does not close a shard
    shard.write_text(json.dumps({'_writer': dict(host=res.HOST, pid=os.getpid())}) + '\n' + json.dumps(row(seed=3, _closed=1)) + '\n')
    assert comp.shard_state(shard) == 'open'


# ---------------------------------------------------------------- 27.10: forced re-runs and clock skew
def test_forced_re_runs_are_ordered_by_the_store_not_by_clocks(tmp_path, monkeypatch):
    store = tmp_path/'results.jsonl'
    key = run_key(row())
    with res.StoreWriter(store) as w: w.append([row(test=.1)])
    fast = lambda: time.strftime('%Y-%m-%dT%H:%M:%S.000000Z', time.gmtime(time.time() + 3600))
    monkeypatch.setattr(res, 'utc_now', fast)                    # a host whose clock is one hour fast
    with res.StoreWriter(store) as w: w.append([row(test=.2)], supersedes='fix A')
    monkeypatch.undo()
    with res.StoreWriter(store) as w: w.append([row(test=.3)], supersedes='fix B')   # later, on a right clock
    for _ in range(2):
        assert res.current_rows(read_rows(store))[key]['test_score'] == .3
        run = FinetuneRun(row()['checkpoint_name'], row()['dataset'], (row()['dataset'],), row()['lr'], row()['seed'])
        assert not res.missing(store, [run], force='fix B') and res.missing(store, [run], force='fix A')
        comp.compact(store)


# ---------------------------------------------------------------- 27.11: a symlinked store
def test_a_symlinked_store_is_one_store(tmp_path):
    real = tmp_path/'shared'/'results.jsonl'; real.parent.mkdir()
    link = tmp_path/'mine'/'results.jsonl'; link.parent.mkdir()
    link.symlink_to(real)
    with res.StoreWriter(link) as w: w.append([row(seed=0, test_scores_i=[1, 0])])
    with res.StoreWriter(real) as w: w.append([row(seed=1)])
    assert not (tmp_path/'mine'/'results.d').exists()
    assert sorted(load_results(link).seed) == sorted(load_results(real).seed) == [0, 1]
    comp.compact(link)
    assert link.is_symlink() and sorted(load_results(real).seed) == [0, 1]
    assert list(res.read_examples(link)) == list(res.read_examples(real)) == [run_key(row(seed=0))]
    assert comp.store_health(link)['runs'] == 2


# ---------------------------------------------------------------- 27.15: duplicates are not seeds
def test_mean_selection_counts_a_run_stored_twice_once():
    import pandas as pd
    runs = pd.DataFrame([row(lr=lr, seed=s, val=.5 + .1 * (lr > 1e-5), test=.5 + .1 * s) for lr in (1e-5, 1e-4) for s in range(3)])
    for sel in aggr.SELECTIONS:
        once, twice = aggr.aggregate(runs, sel), aggr.aggregate(pd.concat([runs, runs.iloc[:4]]), sel)
        assert twice.n_seeds.item() == 3, sel
        assert np.allclose(twice[['score', 'ci_low', 'ci_high']], once[['score', 'ci_low', 'ci_high']]), sel


# ---------------------------------------------------------------- 27.17: crashes that should be clear errors
def test_a_row_whose_written_at_is_a_number_is_skipped_and_named(tmp_path):
    from mlmclm.base.files import append_jsonl
    store = tmp_path/'results.jsonl'
    with res.StoreWriter(store) as w: w.append([row(seed=0)])
    append_jsonl(store, dict(row(seed=1), written_at=1700000000.5))
    with pytest.warns(UserWarning, match='line 1: written_at=1700000000.5 is not a time'):
        assert load_results(store).seed.tolist() == [0]
    assert quietly(comp.store_health, store)['unreadable'] == {str(store): 1}
    quietly(comp.compact, store)
    assert load_results(store).seed.tolist() == [0]


def test_a_dangling_symlink_among_the_shards_is_named(tmp_path):
    store = tmp_path/'results.jsonl'
    with res.StoreWriter(store) as w: w.append([row(seed=0)])
    gone = store.with_suffix('.d')/'gone.jsonl'
    gone.symlink_to(tmp_path/'nowhere.jsonl')
    with pytest.warns(UserWarning, match=r'gone\.jsonl: skipped .*a symbolic link to .*nowhere\.jsonl, which does not exist'):
        assert load_results(store).seed.tolist() == [0]
    assert quietly(comp.compact, store)['shards'] == 1
    assert quietly(load_results, store).seed.tolist() == [0] and gone.is_symlink()
    assert 'gone.jsonl' in comp.describe_health(quietly(comp.store_health, store))


def test_a_shard_whose_file_name_is_not_utf8_is_compacted(tmp_path):
    store = tmp_path/'results.jsonl'
    with res.StoreWriter(store) as w: w.append([row(seed=0)])
    d = store.with_suffix('.d')
    shard = next(d.glob('*.jsonl'))
    with open(shard, 'a') as f: f.write('garbage\n')
    os.rename(shard, os.fsencode(d) + b'/bad\xff.jsonl')
    assert quietly(comp.compact, store)['rejected'] == 1
    assert quietly(comp.compact, store)['rejected'] == 0        # the next one too
    assert list((d/'compacting').iterdir()) == [] and load_results(store).seed.tolist() == [0]
    assert r'bad\xff.jsonl' in next(d.glob('rejected-*.txt')).read_text()


@pytest.mark.parametrize('lease', [None, 'soon', [1], -5])
def test_a_claim_whose_lease_is_not_a_number_is_read(tmp_path, lease):
    import mlmclm.base.claims as claims
    store = tmp_path/'results.jsonl'
    c = store.with_suffix('.d')/'claims'/'x.claim'; c.parent.mkdir(parents=True)
    c.write_text(json.dumps(dict(host='elsewhere', pid=5, lease_s=lease)))
    assert claims.claim_state(c, 60)[0] == 'running'              # fresh: the caller's lease applies
    assert comp.store_health(store)['claims'] == {'running': 1}
    os.utime(c, (time.time() - 120, time.time() - 120))
    assert claims.claim_state(c, 60)[0] == 'stale'
    held = claims.try_claim(c, 60)
    assert held is not None; held.release()


def test_workers_recreate_a_deleted_claims_folder(tmp_path, monkeypatch):
    import shutil
    import mlmclm.base.claims as claims
    store = tmp_path/'results.jsonl'
    path = work_claim_path(store, 'unit')
    for name in ('_create_exclusive', 'fs_now'):                # `rm -rf results.d/claims` at the worst moments
        if name == 'fs_now':                                    # a stale claim to read first (its owner is gone)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(dict(host='elsewhere', pid=1, lease_s=1)))
            os.utime(path, (time.time() - 60, time.time() - 60))
        real, calls = getattr(claims, name), []
        def removing(*a, real=real, calls=calls, **k):
            if not calls: calls.append(1); shutil.rmtree(path.parent, ignore_errors=True)
            return real(*a, **k)
        monkeypatch.setattr(claims, name, removing)
        with claim_work(store, 'unit', lease_s=60) as mine: assert mine, name
        monkeypatch.undo()
        assert calls and not path.exists()


REMOVER = r'''
import shutil, sys, time
while True:
    shutil.rmtree(sys.argv[1], ignore_errors=True); time.sleep(0.01)
'''


@pytest.mark.slow
def test_workers_carry_on_while_the_claims_folder_is_deleted_again_and_again(tmp_path, worker):
    store = tmp_path/'results.jsonl'
    (tmp_path/'remover.py').write_text(REMOVER)
    remover = subprocess.Popen([sys.executable, str(tmp_path/'remover.py'), str(store.with_suffix('.d')/'claims')])
    try:
        procs = [worker(dict(what='fake', store=str(store), units=150, rotate=i * 50, who=f'w{i}')) for i in range(3)]
        for p in procs:
            out, err = p.communicate(timeout=600)
            assert p.returncode == 0, err[-3000:]
    finally:
        remover.kill(); remover.wait()
    keys = {run_key(dict(checkpoint_name=f'ck{u % 2}', dataset='sst2', lr=1e-4, seed=u)) for u in range(150)}
    assert set(stored(store)) == keys                           # every unit done (some twice: their claims were deleted)


# ---------------------------------------------------------------- 27.18: a run folder the store would refuse
def test_a_run_folder_of_learning_rate_zero_is_skipped_and_named(tmp_path):
    write_fixture_tree(tmp_path/'E')
    zero = tmp_path/'E'/'results'/'610m-clm-42k'/'SC'/'sst2'/'lr0_sd0'; zero.mkdir()
    (zero/'results.json').write_text('{"validation": {"score": 0.5}, "test": {"score": 0.5}}')
    report = pr.import_tree(tmp_path/'E', tmp_path/'results.jsonl', progress=False)
    assert report['imported'] == 48 and len(report['skipped']) == 4
    reason = next(s['reason'] for s in report['skipped'] if 'lr0_sd0' in s['path'])
    assert 'lr=0.0 is not a finite number > 0' in reason


# ---------------------------------------------------------------- 26: rows that do not count toward the paper's families
def test_rows_outside_the_papers_families_count_in_no_aggregation(tmp_path):
    import pandas as pd
    write_fixture_tree(tmp_path/'E')
    for lr in (1e-5, 1e-4):
        for s in range(3):                                      # the authors' `qed`: a QA set the paper leaves out
            run = tmp_path/'E'/'results'/'610m-clm-42k'/'QA'/'qed'/f'lr{lr:.0e}_sd{s}'; run.mkdir(parents=True)
            (run/'results.json').write_text(json.dumps({'validation': {'score': .1}, 'test': {'score': .1, 'scores_i': [0.] * 50}}))
    store = tmp_path/'results.jsonl'
    pr.import_tree(tmp_path/'E', store, progress=False)
    every = load_results(store)
    paper = every[every.dataset != 'qed']
    assert len(every) == len(paper) + 6
    for f in (aggr.aggregate, aggr.seed_family_scores, aggr.family_scores, aggr.lr_curve, aggr.lr_sensitivity,
              lambda r: aggr.bootstrap_intervals(r, res.read_examples(store))):
        pd.testing.assert_frame_equal(f(every).reset_index(drop=True), f(paper).reset_index(drop=True))
    assert res.tidy_results(every).in_paper.eq(False).sum() == 6   # the tidy table keeps the flag for the figures
    tidy = tmp_path/'results.csv'; res.tidy_results(every).to_csv(tidy, index=False)
    pd.testing.assert_frame_equal(aggr.family_scores(res.read_results(tidy)), aggr.family_scores(paper))


# ================================================================ third fault attack (issue 34)
# N7, N8, N15: FIFOs, /dev/zero and huge files among the shards and claims --------------------------------------------
def test_a_fifo_among_the_shards_blocks_no_reader(tmp_path):
    store = store_with_rows(tmp_path)
    fifo = res.shard_dir(store)/'zz.jsonl'
    os.mkfifo(fifo)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter('always')
        assert len(finishes(lambda: res.load_results(store))) == 2
    assert any('zz.jsonl' in str(m.message) and 'a named pipe (FIFO), not a regular file' in str(m.message) for m in w)
    health = finishes(lambda: comp.store_health(store))
    assert health['unreadable'] == {str(fifo): 1} and health['runs'] == 2
    assert finishes(lambda: res.missing(store, [FinetuneRun('610m-clm-42k', 'sst2', ('sst2',), 1e-5, 0)], warn=False)) == []
    finishes(lambda: comp.compact(store, abandoned_after_s=0))
    assert fifo.exists() and len(res.read_rows(store, warn=False)) == 2   # left in place, named; the rows merged


def test_a_shard_linked_to_dev_zero_or_too_large_is_named_not_read(tmp_path):
    store = store_with_rows(tmp_path)
    d = res.shard_dir(store)
    (d/'zero.jsonl').symlink_to('/dev/zero')
    huge = d/'huge.jsonl'
    with open(huge, 'wb') as f: f.truncate(core.SHARED_MAX_BYTES + 1)   # sparse: nothing is written
    problems = finishes(lambda: res.scan_store(store))[1]
    assert problems[d/'zero.jsonl'] == ['the whole file: a symbolic link to /dev/zero; a shared file is never read through a link']
    assert 'more than the 4,294,967,296 allowed' in problems[huge][0]
    assert len(res.load_results(store)) == 2


def test_a_fifo_in_place_of_a_claim_blocks_nothing(tmp_path):
    store = store_with_rows(tmp_path)
    run = FinetuneRun('610m-clm-42k', 'sst2', ('sst2',), 1e-3, 0)
    claim = work_claim_path(store, run.work)
    claim.parent.mkdir(parents=True, exist_ok=True)
    os.mkfifo(claim)
    assert finishes(lambda: comp.store_health(store))['claims'] == {'running': 1}   # aged by its mtime, as any claim
    assert finishes(lambda: try_claim(claim, lease_s=60)) is None
    time.sleep(0.05)
    held = finishes(lambda: try_claim(claim, lease_s=0.01))                     # past its lease: taken over
    assert held is not None and claim.is_file()
    held.release()
