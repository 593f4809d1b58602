"""Issue 49, the Slurm finding: fine-tuning array tasks ask a stated number of CPUs and run their kernel on that many
threads, and a cancelled task releases its claims. On the package's test cluster each task asked Slurm's default of one
CPU and set no thread count, so its kernel ran a thread per core: eight tasks on two cores reached a load of 19, and
two-minute fine-tunes took 11-27. Cancelled tasks left their claims, which blocked their runs for the lease on
another node.

The first part needs no cluster; the second runs the demo's fine-tuning array on the throw-away single-node cluster
(`.ci/slurm`, as tests/study/test_launchers_slurm.py), skipped only where this machine cannot run Slurm."""
import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mlmclm.base.files import project_root
from mlmclm.protocol.run_names import CONTROL
from mlmclm.protocol.runs import run_key, work_claim_path
from mlmclm.results.store import read_rows
from mlmclm.study import launchers
from mlmclm.study.launchers import submit_finetune_array
from mlmclm.study.plan import demo_plan, finetune_jobs, select

ROOT = project_root()
PY = sys.executable
# the demo's fine-tuning grid cut to two array tasks: the control model on one dataset, two seeds, 10 steps each
FINETUNE = select(demo_plan(datasets=('rt_sentiment',), seeds=(0, 1)), pattern=CONTROL)
FINETUNE_STEPS = dict(max_steps=10)


# ---------------------------------------------------------------- no cluster needed
class _Executor:   # submitit's AutoExecutor, standing in: what the array would ask Slurm for
    asked = {}
    def __init__(self, folder): pass
    def update_parameters(self, **kw): _Executor.asked.update(kw)
    def map_array(self, fn, *args): return list(zip(*args))


def test_an_array_asks_a_stated_number_of_cpus(tmp_path, monkeypatch):
    import submitit
    monkeypatch.setattr(submitit, 'AutoExecutor', _Executor)
    assert len(submit_finetune_array(FINETUNE, tmp_path, tmp_path/'jobs', overrides=FINETUNE_STEPS)) == 2
    assert (_Executor.asked['cpus_per_task'], _Executor.asked['gpus_per_node']) == (8, 1)
    submit_finetune_array(FINETUNE, tmp_path, tmp_path/'jobs', overrides=FINETUNE_STEPS, cpus_per_task=2)
    assert _Executor.asked['cpus_per_task'] == 2


def test_a_task_runs_its_kernel_on_its_cpus(tmp_path, monkeypatch):
    "What the kernel of an array task inherits: as many threads as Slurm gave the task CPUs."
    seen = []
    monkeypatch.setattr(launchers, 'run_notebook', lambda nb, params, out: seen.append(
        {k: os.environ.get(k) for k in ('OMP_NUM_THREADS', 'MKL_NUM_THREADS', 'RAYON_NUM_THREADS')}) or out)
    monkeypatch.setenv('SLURM_CPUS_PER_TASK', '3')
    point, run = finetune_jobs(FINETUNE)[0]
    launchers._finetune_job(dataclasses.replace(FINETUNE, runs={}, evals=[point]), run, str(tmp_path), {})
    assert seen == [dict(OMP_NUM_THREADS='3', MKL_NUM_THREADS='3', RAYON_NUM_THREADS='3')]


_HOLDER = """
import sys, time
from mlmclm.protocol.runs import claim_work
with claim_work(sys.argv[1], 'rt_sentiment lr=0.001 seed=0') as mine:
    print('held', mine, flush=True)
    time.sleep(60)
"""


def test_sigterm_releases_a_fine_tuning_runs_claim(tmp_path):
    "What a cancelled task's kernel gets from Slurm before SIGKILL: its claim goes, and it ends as SIGTERM ends it."
    store = tmp_path/'results.jsonl'
    claim = work_claim_path(store, 'rt_sentiment lr=0.001 seed=0')
    p = subprocess.Popen([PY, '-c', _HOLDER, str(store)], stdout=subprocess.PIPE, text=True, cwd=ROOT)
    assert p.stdout.readline() == 'held True\n' and claim.exists()
    p.send_signal(signal.SIGTERM)
    p.communicate(timeout=60)
    assert p.returncode == -signal.SIGTERM and not claim.exists()


# ---------------------------------------------------------------- the real cluster
def _slurm_script(*args, timeout=300):
    return subprocess.run(['bash', str(ROOT/'.ci'/'slurm'), *args], capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope='module')
def cluster():
    "A running single-node cluster (started here and stopped afterwards, unless it ran already); SLURM_CONF set."
    ran = _slurm_script('status').returncode == 0
    start = _slurm_script('start')
    if start.returncode == 3: pytest.skip(start.stderr.strip().splitlines()[-1])
    assert start.returncode == 0, start.stderr[-3000:]
    conf = start.stdout.strip().rsplit('SLURM_CONF=', 1)[1]
    saved = {k: os.environ.get(k) for k in ('SLURM_CONF', 'OMP_NUM_THREADS', 'MKL_NUM_THREADS')}
    os.environ.update(SLURM_CONF=conf, OMP_NUM_THREADS='1', MKL_NUM_THREADS='1')   # what a task would run without its own
    yield conf
    for k, v in saved.items():
        if v is None: os.environ.pop(k, None)
        else: os.environ[k] = v
    if not ran: _slurm_script('stop', timeout=120)


def _wait(what: str, check, deadline_s: float, every: float = 0.5):
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        if out := check(): return out
        time.sleep(every)
    pytest.fail(f'{what}: not within {deadline_s:.0f} s')


def _job(job_id: str) -> dict:
    text = subprocess.run(['scontrol', 'show', 'job', '-o', job_id], capture_output=True, text=True, timeout=60).stdout
    return dict(kv.split('=', 1) for kv in text.split() if '=' in kv)


def _ended(job_id: str, deadline_s: float = 900) -> dict:
    return _wait(f'job {job_id} ends', lambda: (j := _job(job_id)).get('JobState') in
                 ('COMPLETED', 'FAILED', 'CANCELLED', 'TIMEOUT', 'OUT_OF_MEMORY', 'NODE_FAIL') and j, deadline_s)


def _claims(store: Path) -> dict:
    "The live work claims of `store`: array task -> claim (host, pid, Slurm job)."
    found = {}
    for p in (store.parent/'results.d'/'claims').glob('*.claim') if (store.parent/'results.d'/'claims').is_dir() else []:
        try: info = json.loads(p.read_text())
        except (OSError, ValueError): continue
        if info.get('slurm_array'): found[info['slurm_array']] = dict(info, path=p)
    return found


def test_a_cancelled_task_releases_its_claim_and_a_resubmission_runs_exactly_what_is_missing(cluster, tmp_path):
    root, store = tmp_path/'study', tmp_path/'study'/'results.jsonl'
    tasks = submit_finetune_array(FINETUNE, root, tmp_path/'jobs', overrides=FINETUNE_STEPS, cpus_per_task=2)
    assert len(tasks) == 2
    first = tasks[0]
    claim = _wait("the first task's kernel claims its run", lambda: _claims(store).get(first.job_id), 600, every=0.2)
    kernel = claim['pid']
    os.kill(kernel, signal.SIGSTOP)                                       # a run still fine-tuning when cancelled
    environ = dict(kv.split('=', 1) for kv in Path(f'/proc/{kernel}/environ').read_text().split('\0') if '=' in kv)
    assert (environ['SLURM_CPUS_PER_TASK'], environ['OMP_NUM_THREADS'], environ['MKL_NUM_THREADS']) == ('2', '2', '2')
    assert _job(first.job_id)['NumCPUs'] == '2'
    subprocess.run(['scancel', first.job_id], check=True, timeout=60)
    assert _ended(first.job_id, 120)['JobState'] == 'CANCELLED'
    _wait('the cancelled task releases its claim', lambda: not claim['path'].exists(), 60)
    assert _ended(tasks[1].job_id)['JobState'] == 'COMPLETED'
    done = {run_key(r) for r in read_rows(store)}
    wanted = {k for _, r in finetune_jobs(FINETUNE) for k in r.keys}
    assert len(done) == len(wanted) - len(finetune_jobs(FINETUNE)[0][1].keys)   # the cancelled task's run is missing
    again = submit_finetune_array(FINETUNE, root, tmp_path/'jobs', overrides=FINETUNE_STEPS, cpus_per_task=2)
    assert len(again) == 1                                                 # exactly the missing run, at once
    assert _ended(again[0].job_id)['JobState'] == 'COMPLETED'
    assert sorted(run_key(r) for r in read_rows(store)) == sorted(wanted)  # every run once
