"""Experiment trackers (`mlmclm.base.trackers`, issue 37 item 4): a pretraining run and a fine-tuning sweep log to
MLflow, and `log_with` refuses a tracker accelerate does not support.

MLflow's file store runs here with no server and no account (mlflow-skinny, a dev requirement); MLflow 3 keeps it
behind MLFLOW_ALLOW_FILE_STORE."""
import pytest

from mlmclm.base.files import read_jsonl
from mlmclm.pretraining.loop import pretrain
from mlmclm.protocol.runs import pretrain_config


@pytest.fixture
def mlflow_store(tmp_path, monkeypatch):
    store = tmp_path/'mlruns'
    monkeypatch.setenv('MLFLOW_TRACKING_URI', store.as_uri())
    monkeypatch.setenv('MLFLOW_ALLOW_FILE_STORE', 'true')
    from mlflow.tracking import MlflowClient
    return MlflowClient(store.as_uri())


def _logged(client, experiment: str) -> tuple[dict, dict]:
    "The one run of `experiment`: each metric's (step, value) history, and its parameters."
    exp = client.get_experiment_by_name(experiment)
    run, = client.search_runs([exp.experiment_id])
    history = {k: [(m.step, m.value) for m in client.get_metric_history(run.info.run_id, k)] for k in run.data.metrics}
    return history, run.data.params


def test_a_pretraining_run_logs_its_metrics_to_mlflow(tmp_path, mlflow_store):
    cfg = pretrain_config(size='tiny', schedule='mlm', total_steps=3, seq_len=32, batch_size=4, warmup_steps=1,
                          decay_steps=1, log_every=1, heldout_rows=4, heldout_every=3, progress=False, prefetch=0,
                          out_dir=str(tmp_path), run_id='tracked', log_with='mlflow')
    folder = pretrain(cfg)
    rows = read_jsonl(folder/'metrics.jsonl')
    history, params = _logged(mlflow_store, 'tracked')
    assert history['loss'] == [(r['step'], pytest.approx(r['loss'])) for r in rows] and len(rows) == 3
    assert history['heldout_loss'] == [(3, pytest.approx(rows[-1]['heldout_loss']))]
    assert (params['schedule'], params['total_steps'], params['log_with']) == ('mlm', '3', 'mlflow')


def test_a_finetuning_sweep_logs_each_runs_scores_to_mlflow(tmp_path, mlflow_store):
    from mlmclm.finetuning.sweep import finetune_sweep
    from mlmclm.protocol.runs import finetune_config
    cfg = finetune_config(tasks='rt_sentiment', lrs='1e-3', seeds='0,1', max_steps=1, batch_size=4, micro_batch_size=4,
                          max_eval_examples=4, results=str(tmp_path/'results.jsonl'), progress=False, log_with='mlflow')
    rows = finetune_sweep(cfg).sort_values('seed')   # the store's results after the sweep
    history, params = _logged(mlflow_store, 'finetune-tiny-random')
    assert history['rt_sentiment/val_score'] == [(i + 1, pytest.approx(v)) for i, v in enumerate(rows.val_score)]
    assert history['seed'] == [(1, 0.0), (2, 1.0)] and params['tasks'] == 'rt_sentiment'


def test_log_with_refuses_an_unknown_or_missing_tracker_and_reads_the_old_switch(capsys):
    from mlmclm.base.configs import ConfigError
    from mlmclm.pretraining.checks import check_pretrain_config
    from mlmclm.protocol.runs import finetune_config
    for build in (pretrain_config, finetune_config):
        with pytest.raises(ConfigError, match="log_with='mlflow,tensorbord' names 'tensorbord', which is not a tracker "
                                              "accelerate supports; allowed: tensorboard, wandb, mlflow, trackio"):
            build(log_with='mlflow,tensorbord')
    cfg = pretrain_config(tensorboard=True)   # an old config
    assert cfg.log_with == 'tensorboard' and "read as log_with='tensorboard'" in capsys.readouterr().out
    assert pretrain_config(tensorboard=False).log_with is None
    pytest.importorskip('accelerate')
    from accelerate.tracking import get_available_trackers
    if 'tensorboard' not in {str(t) for t in get_available_trackers()}:
        with pytest.raises(ConfigError, match="the package of tracker 'tensorboard' is not installed"):
            check_pretrain_config(cfg)
