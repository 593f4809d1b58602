"""Issue 37 item 5: every checkpoint folder carries a Hugging Face model card, whose loading snippet runs with plain
transformers (no mlmclm on the path), and `mlmclm push` refuses what is not a checkpoint and says clearly when the
hub cannot be reached."""
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from huggingface_hub import ModelCard

from mlmclm.base.files import read_jsonl
from mlmclm.pretraining.loop import pretrain
from mlmclm.protocol.runs import pretrain_config

PY = sys.executable
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope='module')
def run_folder(tmp_path_factory):
    out = tmp_path_factory.mktemp('runs')
    cfg = pretrain_config(size='tiny', schedule='clm:2,mlm40:2', total_steps=4, seq_len=32, batch_size=4,
                          warmup_steps=1, decay_steps=1, log_every=1, heldout_rows=4, heldout_every=2,
                          checkpoint_steps='2', progress=False, out_dir=str(out), run_id='carded', prefetch=0)
    return pretrain(cfg)


def _plain_env():
    "No mlmclm on the path: the snippet must run with transformers alone."
    return {k: v for k, v in os.environ.items() if k != 'PYTHONPATH'} | {'HF_HUB_OFFLINE': '1'}


def test_every_checkpoint_carries_a_card_naming_its_schedule_steps_and_losses(run_folder):
    metrics = read_jsonl(run_folder/'metrics.jsonl')
    for step in (2, 4):
        card = ModelCard.load(run_folder/'checkpoints'/f'step-{step}'/'README.md')   # the hub's own parser
        assert (card.data.library_name, card.data.pipeline_tag) == ('transformers', 'fill-mask')
        assert set(card.data.tags) == {'mlmclm', 'llama', 'clm', 'mlm'}
        assert '`clm:2,mlm40:2`: clm for 2 steps, then mlm40 for 2 steps' in card.text
        assert f'| step | {step} of 4 |' in card.text
        row = next(m for m in metrics if m['step'] == step)
        assert f"| training loss | {row['loss']:.4f} at step {step} |" in card.text
        assert f"| held-out loss | {row['heldout_loss']:.4f} at step {step} |" in card.text
        assert f"| tokens seen | {row['tokens_seen']:,} |" in card.text


@pytest.mark.parametrize('which', [0, 1], ids=['transformers', 'sentence-transformers'])
def test_the_cards_loading_snippets_run_with_plain_transformers(run_folder, which, tmp_path):
    folder = run_folder/'checkpoints'/'step-4'
    snippets = re.findall(r'```python\n(.*?)```', (folder/'README.md').read_text(), re.S)
    assert len(snippets) == 2
    code = snippets[0] + snippets[which] * (which == 1) + (
        "\nassert hidden.shape[-1] == encoder.config.hidden_size and len(predictions) == 3\nprint('ran')" if which == 0
        else "\nassert embeddings.shape == (2, embedder.get_sentence_embedding_dimension())\nprint('ran')")
    script = tmp_path/'snippet.py'; script.write_text(code)
    out = subprocess.run([PY, str(script)], cwd=folder, env=_plain_env(), capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and out.stdout.split()[-1] == 'ran', out.stderr[-3000:]
    assert 'mlmclm' not in code   # no mlmclm code in the snippet


def _push(*args):
    "`mlmclm push ARGS`, through the command line's dispatcher."
    code = 'import sys; from mlmclm.cli import main; sys.exit(main(sys.argv[1:]))'
    return subprocess.run([PY, '-c', code, 'push', *map(str, args)], capture_output=True, text=True, cwd=ROOT,
                          env=os.environ | {'HF_HUB_OFFLINE': '1'}, timeout=120)


def test_push_refuses_a_folder_that_is_not_a_checkpoint(run_folder, tmp_path):
    out = _push(tmp_path, 'someone/model')
    assert out.returncode == 2 and f"'{tmp_path}' is not a checkpoint folder: it has no config.json or model.safetensors" \
        in out.stderr, out.stderr
    out = _push(run_folder/'state', 'someone/model')
    assert out.returncode == 2 and 'is a training-state folder' in out.stderr, out.stderr


def test_push_offline_fails_clearly_before_changing_anything(run_folder):
    folder = run_folder/'checkpoints'/'step-2'
    before = (folder/'README.md').read_text()
    out = _push(folder, 'someone/model')
    assert out.returncode == 1, out
    assert f"cannot push '{folder}' to 'someone/model': the hub did not answer (OfflineModeIsEnabled" in out.stderr
    assert 'HF_HUB_OFFLINE unset' in out.stderr and 'nothing was uploaded' in out.stderr
    assert (folder/'README.md').read_text() == before


def test_the_snippets_model_is_the_bidirectional_model_also_for_a_clm_checkpoint(run_folder):
    "`is_causal=False` in the snippet: transformers computes what our model computes bidirectionally (step 2 is CLM-trained)."
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from mlmclm.model.checkpoints import load
    folder = run_folder/'checkpoints'/'step-2'
    assert '"is_causal": true' in (folder/'config.json').read_text()
    ids = AutoTokenizer.from_pretrained(folder)('To be, or not to be, that is', return_tensors='pt')['input_ids']
    theirs, ours = AutoModelForCausalLM.from_pretrained(folder, is_causal=False).eval(), load(folder).eval()
    with torch.no_grad():
        assert torch.equal(theirs(ids).logits, ours(ids, is_causal=False).logits)
        assert not torch.allclose(theirs(ids).logits, ours(ids, is_causal=True).logits)


# Issue 37 item 4: experiment trackers. MLflow's file store runs here with no server and no account (mlflow-skinny,
# a dev requirement); MLflow 3 keeps it behind MLFLOW_ALLOW_FILE_STORE.

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
