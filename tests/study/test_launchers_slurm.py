"""The cluster path on a real Slurm (issue 35) and a requeue that survives another node (issue 33 item 2).

The first part needs no cluster: claims made inside a Slurm job record the job, a requeued run of the same job takes
its own fresh claim over from another host (another job's claim it does not), SIGTERM releases a claim, and a claim
file that is no claim is named. The second part starts a throw-away single-node Slurm cluster (`.ci/slurm start`:
munge, mariadb + slurmdbd, slurmctld, slurmd; Debian's packages, installed when missing) and drives the package's own
entry points through it: `submit_finetune_array`, `submit_pretrain_jobs`, `mlmclm slurm`, `mlmclm status`. It is
skipped, with the reason, only where the machine cannot run Slurm (not root, no apt). Every wait has a deadline.

The jobs are submitted together at the start (one fixture) so that they run side by side, and each test then waits
for its own: the whole Slurm part takes about as long as its longest job."""
import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from mlmclm.base.configs import ConfigError
from mlmclm.base.files import project_root, read_jsonl, to_json
from mlmclm.base.claims import ClaimHeld, HOST, try_claim
from mlmclm.model.checkpoints import load
from mlmclm.results.store import read_rows
from mlmclm.protocol.runs import PretrainRun, pretrain_config, run_key
from mlmclm.pretraining.loop import pretrain
from mlmclm.study.launchers import pretrain_job_specs, submit_finetune_array, submit_pretrain_jobs
from mlmclm.protocol.run_names import CONTROL
from mlmclm.study.plan import demo_plan, finetune_jobs, select

ROOT = project_root()
PY = sys.executable
MLMCLM = str(Path(PY).with_name('mlmclm'))   # the command line, as installed
JOB = dict(SLURM_JOB_ID='4242', SLURM_CLUSTER_NAME='gpu-cluster')


# ---------------------------------------------------------------- claims of Slurm jobs (no cluster needed)
def _foreign_claim(path, **info):
    "A fresh claim left by a process on another host (a node that went away), as `try_claim` writes one."
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(to_json(dict(host='node-gone', pid=12345, started='earlier', lease_s=1800.0, note='x', **info),
                            indent=None) + '\n')


def _in_job(monkeypatch, restart=None, **env):
    for k, v in (JOB | env).items(): monkeypatch.setenv(k, v)
    if restart is None: monkeypatch.delenv('SLURM_RESTART_COUNT', raising=False)
    else: monkeypatch.setenv('SLURM_RESTART_COUNT', str(restart))


@pytest.mark.parametrize('theirs, ours, taken', [
    (dict(slurm_job='4242', slurm_cluster='gpu-cluster', slurm_restart=0), 1, True),    # our job, requeued since
    (dict(slurm_job='4241', slurm_cluster='gpu-cluster', slurm_restart=0), 1, False),   # another job
    (dict(slurm_job='4242', slurm_cluster='cpu-cluster', slurm_restart=0), 1, False),   # its id on another cluster
    (dict(slurm_job='4242', slurm_cluster='gpu-cluster', slurm_restart=1), 1, False),   # a task of this same run
    (dict(), 1, False),                                                                 # not made in a Slurm job
])
def test_a_requeued_slurm_job_takes_over_its_own_fresh_claim_and_no_other(tmp_path, monkeypatch, theirs, ours, taken):
    path = tmp_path/'claims'/'run.claim'
    _foreign_claim(path, **theirs)
    _in_job(monkeypatch, restart=ours)
    held = try_claim(path)
    assert (held is not None) == taken
    info = json.loads(path.read_text())
    if taken:
        assert (info['host'], info['pid'], info['slurm_job'], info['slurm_restart']) == (HOST, os.getpid(), '4242', 1)
        held.release()
        assert not path.exists()
    else: assert info['host'] == 'node-gone'


def test_a_claim_records_the_slurm_job_and_its_array_task(tmp_path, monkeypatch):
    _in_job(monkeypatch, SLURM_ARRAY_JOB_ID='4240', SLURM_ARRAY_TASK_ID='2')
    held = try_claim(tmp_path/'a.claim')
    info = json.loads((tmp_path/'a.claim').read_text())
    held.release()
    assert {k: info[k] for k in info if k.startswith('slurm')} == dict(
        slurm_cluster='gpu-cluster', slurm_job='4242', slurm_restart=0, slurm_array='4240_2')


def _tiny(tmp_path, **kw):
    return pretrain_config(size='tiny', schedule='clm', total_steps=2, seq_len=32, batch_size=4, warmup_steps=1,
                           decay_steps=1, progress=False, prefetch=0, out_dir=str(tmp_path), run_id='r', **kw)


def test_a_requeued_pretraining_job_trains_through_its_own_fresh_claim_but_not_another_jobs(tmp_path, monkeypatch):
    "Issue 33 item 2: the requeued job (restart 1) trains; under another job id the run is refused, naming the holder."
    cfg = _tiny(tmp_path)
    path = PretrainRun('r', tmp_path).claim_path
    _in_job(monkeypatch, restart=1)
    _foreign_claim(path, slurm_job='4241', slurm_cluster='gpu-cluster', slurm_restart=0)
    with pytest.raises(ClaimHeld, match=r'being trained by node-gone pid 12345 since earlier, Slurm job 4241'):
        pretrain(cfg)
    _foreign_claim(path, slurm_job='4242', slurm_cluster='gpu-cluster', slurm_restart=0)
    folder = pretrain(cfg)
    assert (folder/'done.json').is_file() and not path.exists()


def test_a_pretraining_claim_that_is_not_json_is_named_with_how_to_clear_it(tmp_path):
    "Issue 34 item 10: it used to block the run for the lease as 'None pid None since None'."
    cfg = _tiny(tmp_path)
    path = PretrainRun('r', tmp_path).claim_path
    path.parent.mkdir(parents=True)
    path.write_bytes(b'\x00\x00garbage')
    with pytest.raises(ClaimHeld) as e:
        pretrain(cfg)
    assert str(e.value) == (f"the claim {path} of run 'r' is not a claim: it holds b'\\x00\\x00garbage', not the JSON "
                            f"object a worker writes, and blocks the run until it is 1800 s old. If no process trains "
                            f"this run, remove it: rm {path}")


_HOLDER = """
import signal, sys, time
from mlmclm.base.claims import try_claim
if sys.argv[2] == 'handler': signal.signal(signal.SIGTERM, lambda *a: print('own handler', flush=True))
held = try_claim(sys.argv[1]).release_on_sigterm()
print('held', flush=True)
time.sleep(3)
print('went on', held.held(), flush=True)
"""


@pytest.mark.parametrize('before', ['default', 'handler'])
def test_sigterm_releases_the_claim_then_does_what_it_did_before(tmp_path, before):
    path = tmp_path/'run.claim'
    p = subprocess.Popen([PY, '-c', _HOLDER, str(path), before], stdout=subprocess.PIPE, text=True, cwd=ROOT)
    assert p.stdout.readline() == 'held\n' and path.exists()
    p.send_signal(signal.SIGTERM)
    out, _ = p.communicate(timeout=60)
    assert not path.exists()
    if before == 'default': assert (p.returncode, out) == (-signal.SIGTERM, '')
    else: assert (p.returncode, out) == (0, 'own handler\nwent on False\n')


# ---------------------------------------------------------------- a real single-node Slurm cluster
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
    os.environ.update(SLURM_CONF=conf, OMP_NUM_THREADS='1', MKL_NUM_THREADS='1')   # the jobs inherit them
    yield conf
    for k, v in saved.items():
        if v is None: os.environ.pop(k, None)
        else: os.environ[k] = v
    if not ran: _slurm_script('stop', timeout=120)


def _sh(*cmd) -> str:
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, (cmd, res.stderr)
    return res.stdout


def _job(job_id: str) -> dict:
    "Slurm's record of a job: state, restarts, start/end times, reason."
    text = _sh('scontrol', 'show', 'job', '-o', job_id)
    return dict(kv.split('=', 1) for kv in text.split() if '=' in kv)


def _wait(what: str, check, deadline_s: float, every: float = 0.5):
    "Poll `check()` until it returns something true; fail naming `what` after `deadline_s` seconds."
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        out = check()
        if out: return out
        time.sleep(every)
    pytest.fail(f'{what}: not within {deadline_s:.0f} s')


def _ended(job_id: str, deadline_s: float = 420) -> dict:
    return _wait(f'job {job_id} ends', lambda: (j := _job(job_id))['JobState'] in
                 ('COMPLETED', 'FAILED', 'CANCELLED', 'TIMEOUT', 'OUT_OF_MEMORY', 'NODE_FAIL') and j, deadline_s)


def _log(job) -> str:
    return (job.paths.stdout.read_text() if job.paths.stdout.exists() else '') + \
           (job.paths.stderr.read_text() if job.paths.stderr.exists() else '')


def _saved_state(folder: Path) -> bool:
    "The run has saved resumable state (its metrics say it passed its first `save_every`, and the state is there)."
    rows = read_jsonl(folder/'metrics.jsonl') if (folder/'metrics.jsonl').exists() else []
    return bool(rows) and rows[-1]['step'] >= 5 and (folder/'state').is_dir()


def _weights(folder):
    return load(folder).state_dict()


# one pretraining run of 42 steps, saving its state every 4
LONG = dataclasses.replace(select(demo_plan(), pattern='tiny-mlm40-42k'), step_scale=1 / 1000,
                           pretrain_overrides=dict(seq_len=32, batch_size=4, global_batch=8, save_every=4, log_every=1))
LONG_RUN, LAST = 'tiny-mlm40-42k', 'step-42'
# a parent and its child (CPT from the parent's last checkpoint), a few steps each
CHAIN = dataclasses.replace(select(demo_plan(), pattern='tiny-clm-dec42k-mlm40-54k'), step_scale=1 / 2000,
                            pretrain_overrides=dict(seq_len=32, batch_size=4, global_batch=4))
# the demo's fine-tuning grid, cut to two array tasks (the control model on one dataset, two seeds) of 10 steps each
FINETUNE = select(demo_plan(datasets=('rt_sentiment',), seeds=(0, 1)), pattern=CONTROL)
FINETUNE_STEPS = dict(max_steps=10)   # not part of a run's key: the rows count for the demo's runs


def _freeze_after_first_save(root: Path) -> int:
    """Wait until the run under `root` has saved resumable state, then stop its process (SIGSTOP): it stands for a
    long run that is still training when Slurm interrupts it, whatever this machine's speed. Returns its pid."""
    folder, claim = root/LONG_RUN, PretrainRun(LONG_RUN, root).claim_path
    _wait(f'{folder} saves its state', lambda: _saved_state(folder) and claim.exists(), 300, every=0.1)
    pid = json.loads(claim.read_text())['pid']
    os.kill(pid, signal.SIGSTOP)
    assert not (folder/'done.json').exists()
    return pid


def _signalled(pid: int, sig: signal.Signals) -> bool:
    "Whether the stopped process `pid` got `sig`: it waits to be delivered, or Slurm continued the process with it."
    try: text = Path(f'/proc/{pid}/status').read_text()
    except FileNotFoundError: return True                    # it ran its handler (requeued itself) and is gone
    status = dict(line.split(':\t', 1) for line in text.splitlines() if ':\t' in line)
    return status['State'].startswith(('S', 'R')) or any(int(status[k].strip(), 16) >> (sig - 1) & 1
                                                          for k in ('SigPnd', 'ShdPnd'))


@pytest.fixture(scope='module')
def jobs(cluster, tmp_path_factory):
    """Every job of this module, submitted at once so that they run side by side; the two runs that Slurm will
    interrupt are stopped (SIGSTOP) once they have saved state."""
    base = tmp_path_factory.mktemp('slurm')
    out, ids = dict(base=base), []
    try:
        for name in ('limit', 'kill', 'straight'):   # the same run three times: two interrupted, one not
            out[name] = submit_pretrain_jobs(LONG, base/name, base/'jobs', gpus_per_node=1, timeout_min=30)[0]
        out['two'] = submit_pretrain_jobs(LONG, base/'two', base/'jobs', gpus_per_node=2, timeout_min=30)[0]
        out['chain'] = submit_pretrain_jobs(CHAIN, base/'chain', base/'jobs', gpus_per_node=1, timeout_min=30)
        ids += [out[k].job_id for k in ('limit', 'kill', 'straight', 'two')] + [j.job_id for j in out['chain']]
        # a chain whose parent fails: a live worker here holds the parent's claim
        out['held'] = PretrainRun('tiny-clm-42k', base/'failing').try_claim()
        res = subprocess.run([MLMCLM, 'slurm', '--what', 'pretrain', '--preset', 'demo',
                              '--pattern', 'tiny-clm-dec42k-mlm40-54k', '--root', str(base/'failing'),
                              '--folder', str(base/'jobs'), '--gpus-per-node', '1', '--time', '30'],
                             capture_output=True, text=True, timeout=300, cwd=ROOT)
        assert res.returncode == 0 and 'submitted 2 pretraining jobs' in res.stdout, res.stderr[-3000:]
        out['failing'] = dict(line.split(': Slurm job ') for line in res.stdout.splitlines() if ': Slurm job ' in line)
        ids += [v.split()[0] for v in out['failing'].values()]
        out['finetune'] = submit_finetune_array(FINETUNE, base/'study', base/'jobs', overrides=FINETUNE_STEPS)
        ids += [t.job_id for t in out['finetune']]
        out['limit_pid'], out['kill_pid'] = (_freeze_after_first_save(base/n) for n in ('limit', 'kill'))
        yield out
    finally:
        if out.get('held') is not None: out['held'].release()
        for j in ids: subprocess.run(['scancel', j], timeout=60)


def _same_weights_as_the_uninterrupted_run(jobs, folder) -> bool:
    assert _ended(jobs['straight'].job_id)['JobState'] == 'COMPLETED', _log(jobs['straight'])
    a = _weights(jobs['base']/'straight'/LONG_RUN/'checkpoints'/LAST)
    b = _weights(folder/'checkpoints'/LAST)
    return all(torch.equal(a[k], b[k]) for k in a)


def test_a_job_at_its_time_limit_is_requeued_and_resumes_to_the_uninterrupted_weights(jobs):
    """Slurm's time-limit check sends the job USR2 (`--signal=USR2@180`) once less than 180 s are left; the job
    (submitit, `PretrainJob.checkpoint`) requeues itself and resumes from its saved state. Its limit is cut to 2
    minutes past its run time while it is stopped, so the signal comes while it is (still) training."""
    job, folder, pid = jobs['limit'], jobs['base']/'limit'/LONG_RUN, jobs['limit_pid']
    minutes = int(_job(job.job_id)['RunTime'].split(':')[-2]) + 2     # RunTime is [h:]mm:ss (all well under an hour)
    _sh('scontrol', 'update', f'JobId={job.job_id}', f'TimeLimit={minutes}')
    _wait("Slurm's time-limit check signals the job", lambda: _signalled(pid, signal.SIGUSR2), 120)
    try: os.kill(pid, signal.SIGCONT)   # Slurm 22.05 continues a stopped task itself when it signals it
    except ProcessLookupError: pass
    _wait('the job requeues itself', lambda: int(_job(job.job_id)['Restarts']) >= 1, 120)
    _sh('scontrol', 'update', f'JobId={job.job_id}', 'TimeLimit=30')   # the resumed run finishes in peace
    assert _ended(job.job_id)['JobState'] == 'COMPLETED', _log(job)
    log = _log(job)
    assert 'Caught signal SIGUSR2' in log and 'resumed from' in log, log[-3000:]
    assert [m['step'] for m in read_jsonl(folder/'metrics.jsonl')] == list(range(1, 43))
    assert _same_weights_as_the_uninterrupted_run(jobs, folder)


def test_a_killed_job_requeued_resumes_through_its_fresh_claim_from_another_node(jobs):
    """`scancel --signal=KILL` ends the job (Slurm sends SIGTERM, then SIGKILL): the run releases its claim on SIGTERM.
    A node that dies sends nothing: its claim stays, fresh for the lease; written back as that node's, the requeued
    job (the same job id, one restart later) still takes it over and resumes."""
    job, folder = jobs['kill'], jobs['base']/'kill'/LONG_RUN
    claim = PretrainRun(LONG_RUN, jobs['base']/'kill').claim_path
    info = json.loads(claim.read_text())
    assert (info['pid'], info['slurm_job'], info['slurm_restart']) == (jobs['kill_pid'], job.job_id, 0)
    _sh('scancel', '--signal=KILL', job.job_id)
    assert _ended(job.job_id, 60)['JobState'] in ('CANCELLED', 'FAILED')
    assert not claim.exists()                                          # released on SIGTERM
    claim.write_text(to_json(dict(info, host='node-gone'), indent=None) + '\n')   # fresh, on a node that is gone
    _sh('scontrol', 'requeue', job.job_id)
    _wait('the job is requeued', lambda: int(_job(job.job_id)['Restarts']) >= 1, 60)
    assert _ended(job.job_id)['JobState'] == 'COMPLETED', _log(job)
    assert 'resumed from' in _log(job) and not claim.exists()
    assert _same_weights_as_the_uninterrupted_run(jobs, folder)


def test_a_two_task_job_is_one_run_over_gloo_equal_to_one_process(jobs):
    job, folder = jobs['two'], jobs['base']/'two'/LONG_RUN
    assert _ended(job.job_id)['JobState'] == 'COMPLETED', _log(job)
    meta = json.loads((folder/'run.json').read_text())
    assert meta['batch'] == dict(global_batch=8, micro_batch=4, grad_accum=1, processes=2)
    assert _ended(jobs['straight'].job_id)['JobState'] == 'COMPLETED'
    a = _weights(jobs['base']/'straight'/LONG_RUN/'checkpoints'/LAST)
    b = _weights(folder/'checkpoints'/LAST)
    assert max((a[k] - b[k]).abs().max().item() for k in a) < 1e-5   # same rows; only the order of float sums differs


def test_a_child_starts_only_after_its_parents_success(jobs):
    parent, child = jobs['chain']
    p, c = _ended(parent.job_id), _ended(child.job_id)
    assert (p['JobState'], c['JobState']) == ('COMPLETED', 'COMPLETED'), _log(parent) + _log(child)
    assert c['StartTime'] >= p['EndTime'], (p, c)
    meta = json.loads((jobs['base']/'chain'/'tiny-clm-dec42k-mlm40-54k'/'run.json').read_text())
    assert meta['config']['init_from'].endswith('tiny-clm-42k/checkpoints/step-21')


def test_a_child_is_cancelled_when_its_parent_fails(jobs):
    ids = jobs['failing']                          # run -> 'job id[ after parent's]', as `mlmclm slurm` printed them
    parent_id = ids['tiny-clm-42k']
    assert ids['tiny-clm-dec42k-mlm40-54k'].endswith(f' after {parent_id}')
    parent, child = _ended(parent_id), _ended(ids['tiny-clm-dec42k-mlm40-54k'].split()[0], 120)
    assert (parent['JobState'], child['JobState']) == ('FAILED', 'CANCELLED'), (parent, child)
    assert child['Reason'] == 'DependencyNeverSatisfied', child


def test_the_demo_finetuning_grid_runs_as_an_array_each_run_once(jobs):
    tasks, store = jobs['finetune'], jobs['base']/'study'/'results.jsonl'
    assert len(tasks) == 2 and len({t.job_id.split('_')[0] for t in tasks}) == 1   # one array of two tasks
    for t in tasks:
        assert _ended(t.job_id)['JobState'] == 'COMPLETED', _log(t)
    wanted = sorted(k for _, r in finetune_jobs(FINETUNE) for k in r.keys)
    assert sorted(run_key(r) for r in read_rows(store)) == wanted      # every run's row, each once
    assert submit_finetune_array(FINETUNE, jobs['base']/'study', jobs['base']/'jobs', overrides=FINETUNE_STEPS) == []   # nothing left to submit
    status = subprocess.run([MLMCLM, 'status', '--preset', 'demo', '--pattern', CONTROL, '--root',
                             str(jobs['base']/'study')], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert status.returncode == 0, status.stderr
    line = next(l.split() for l in status.stdout.splitlines() if l.split()[:2] == ['control', 'finetune'])
    done, to_do = int(line[2]), int(line[5])
    assert (done, to_do) == (2, len(finetune_jobs(select(demo_plan(), pattern=CONTROL))) - 2), status.stdout


WIDE = dataclasses.replace(LONG, pretrain_overrides=LONG.pretrain_overrides | dict(global_batch=64))   # 16 processes


def test_a_job_no_node_can_run_is_refused_at_submission_naming_the_numbers(cluster, tmp_path):
    "Slurm's own refusal names no number; the package's names what the job asks for and what the nodes have."
    with pytest.raises(ConfigError) as e:
        submit_pretrain_jobs(WIDE, tmp_path, tmp_path/'jobs', gpus_per_node=16)
    assert str(e.value) == (
        f'Slurm refused the pretraining job of {LONG_RUN}: sbatch: error: Batch job submission failed: More processors '
        'requested than permitted. It asks for 1 node(s), each with 16 GPUs and 16 task(s) x 8 CPUs = 128 CPUs; the '
        'cluster has 1 node(s), the largest with 64 CPUs and 8 GPUs')
    assert _sh('squeue', '-h', '-n', f'pretrain-{LONG_RUN}', '-t', 'PENDING') == ''   # nothing left waiting
