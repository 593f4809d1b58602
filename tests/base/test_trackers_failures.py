"""Issue 49, N16 and N17: an experiment tracker that fails is a copy that went missing, not the end of a run. A tracker
whose `log` fails is warned of once, naming it, and dropped; the run goes on (metrics.jsonl and the results store are
the record). Every tracker is finished when a run ends, also when it fails, so that the next run in the same process
starts its own; a tracker that cannot start is a `TrackerError` naming it, with none left open."""
import warnings

import pytest

from mlmclm.base.files import read_jsonl
from mlmclm.base.trackers import TrackerError, Trackers
from mlmclm.pretraining.loop import pretrain
from mlmclm.protocol.runs import pretrain_config

mlflow = pytest.importorskip('mlflow')
from accelerate.tracking import MLflowTracker   # noqa: E402  (after the skip: MLflow is the tracker installed here)


@pytest.fixture
def mlruns(tmp_path, monkeypatch):
    "A local MLflow store in `tmp_path`, and no MLflow run left active by a test."
    monkeypatch.setenv('MLFLOW_TRACKING_URI', f'file://{tmp_path}/mlruns')
    monkeypatch.setenv('MLFLOW_ALLOW_FILE_STORE', 'true')
    yield tmp_path
    while mlflow.active_run() is not None: mlflow.end_run()


def _flaky(monkeypatch, fail_at):
    "MLflow's `log` fails on its `fail_at`-th call (a tracking server that went away), as the attack patched it."
    log, calls = MLflowTracker.log, [0]
    def flaky(self, values, step=None, **kw):
        calls[0] += 1
        if calls[0] == fail_at: raise ConnectionError('tracking server unreachable')
        return log(self, values, step=step, **kw)
    monkeypatch.setattr(MLflowTracker, 'log', flaky)
    return calls


def _cfg(tmp_path, **kw):
    return pretrain_config(size='tiny', schedule='clm', total_steps=8, seq_len=32, batch_size=4, warmup_steps=1,
                           decay_steps=1, data='embedded', progress=False, prefetch=0, log_every=1, save_every=2,
                           checkpoint_steps='', out_dir=str(tmp_path/'runs'), run_id='t', log_with='mlflow', **kw)


def test_n16_a_tracker_that_fails_is_dropped_and_the_run_finishes(mlruns, monkeypatch):
    "It used to end the run with the tracker's own ConnectionError and leave its MLflow run open."
    calls = _flaky(monkeypatch, fail_at=5)
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter('always')
        folder = pretrain(_cfg(mlruns))
    assert (folder/'done.json').is_file()
    assert [r['step'] for r in read_jsonl(folder/'metrics.jsonl')] == list(range(1, 9))   # the record is whole
    dropped = [str(w.message) for w in said if 'experiment tracker' in str(w.message)]
    assert len(dropped) == 1 and dropped[0].startswith("experiment tracker 'mlflow' failed at step 5 (ConnectionError: "
                                                       "tracking server unreachable); it is dropped"), dropped
    assert calls[0] == 5 and mlflow.active_run() is None                  # not called again; finished


def test_n16_trackers_are_finished_when_a_run_fails(mlruns, monkeypatch):
    "A run that fails for its own reason leaves no tracker run open: the same run again in this process starts."
    import mlmclm.pretraining.loop as loop
    steps = loop.train_step
    def broken(run, state, *a):
        if state.step == 3: raise RuntimeError('a bug at step 4')
        return steps(run, state, *a)
    monkeypatch.setattr(loop, 'train_step', broken)
    with pytest.raises(RuntimeError, match='a bug at step 4'):
        pretrain(_cfg(mlruns))
    assert mlflow.active_run() is None
    monkeypatch.setattr(loop, 'train_step', steps)
    assert (pretrain(_cfg(mlruns))/'done.json').is_file()               # resumed in the same process


def test_n17_a_sweep_goes_on_when_its_tracker_times_out(mlruns, monkeypatch):
    "It used to end after its first run, with the tracker's TimeoutError."
    from mlmclm.finetuning.sweep import finetune_sweep
    from mlmclm.protocol.runs import FinetuneConfig
    from mlmclm.results.store import read_rows
    def down(self, values, step=None, **kw): raise TimeoutError('tracker timed out')
    monkeypatch.setattr(MLflowTracker, 'log', down)
    store = mlruns/'l5'/'results.jsonl'
    cfg = FinetuneConfig(tasks='rt_sentiment', lrs='1e-3', seeds='0,1,2', max_steps=1, batch_size=4, micro_batch_size=4,
                         max_eval_examples=4, results=str(store), progress=False, log_with='mlflow')
    with pytest.warns(RuntimeWarning, match="experiment tracker 'mlflow' failed at step 1 \\(TimeoutError"):
        finetune_sweep(cfg)
    assert sorted(r['seed'] for r in read_rows(store)) == [0, 1, 2]
    assert mlflow.active_run() is None


def test_a_tracker_that_cannot_start_is_named_and_leaves_none_open(mlruns, monkeypatch):
    def refuse(self, values): raise ConnectionError('no route to host')
    monkeypatch.setattr(MLflowTracker, 'store_init_configuration', refuse)
    with pytest.raises(TrackerError, match=r"experiment tracker 'mlflow' \(log_with='mlflow'\) could not start: "
                                           r"ConnectionError: no route to host"):
        Trackers('mlflow', 'p', mlruns, config=dict(lr=1e-3))
    assert mlflow.active_run() is None
