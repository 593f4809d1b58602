"""Checkpoints (`mlmclm.model.checkpoints`): every checkpoint folder carries a Hugging Face model card, whose loading
snippet runs with plain transformers (no mlmclm on the path), and `mlmclm push` refuses what is not a checkpoint and
says clearly when the hub cannot be reached (issue 37 item 5); checkpoints honour the umask; loading a release whose
shape differs from our preset warns."""
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from huggingface_hub import ModelCard

from mlmclm.base.files import read_jsonl
from mlmclm.pretraining.loop import pretrain
from mlmclm.protocol.runs import pretrain_config
from mlmclm.model.sizes import model_config
from mlmclm.model.transformer import build_model

from tiny import tiny_checkpoint

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


# ---------------------------------------------------------------- issue 17 (data loss, silent wrong answers), item 10
@pytest.mark.usefixtures('one_thread')   # tiny models: one thread is faster (conftest.py)
def test_item10_checkpoints_honour_the_umask(tmp_path):
    old = os.umask(0o022)
    try: ck = tiny_checkpoint(tmp_path/'ck')
    finally: os.umask(old)
    assert (ck/'model.safetensors').stat().st_mode & 0o777 == 0o644


# ---------------------------------------------------------------- issue 33: a release is compared with our preset
def _hub_release(cache, name: str, cfg=None, model=None) -> None:
    "A hub cache holding `MLMvsCLM/<name>` as `snapshot_download` leaves it: refs/main and one snapshot."
    from mlmclm.model.transformer import to_llama_config_dict
    from mlmclm.model.checkpoints import save
    repo = cache/f'models--MLMvsCLM--{name}'
    snap = repo/'snapshots'/('0' * 40)
    (repo/'refs').mkdir(parents=True); (repo/'refs'/'main').write_text('0' * 40)
    snap.mkdir(parents=True)
    if model is not None: save(model, snap)
    else: (snap/'config.json').write_text(json.dumps(to_llama_config_dict(cfg)))


def test_loading_a_release_warns_where_its_shape_differs_from_our_preset(tmp_path, monkeypatch):
    import huggingface_hub.constants
    from mlmclm.model.checkpoints import load
    monkeypatch.setattr(huggingface_hub.constants, 'HF_HUB_CACHE', str(tmp_path))
    monkeypatch.setattr(huggingface_hub.constants, 'HF_HUB_OFFLINE', True)
    _hub_release(tmp_path, '1b-mlm40-42k', cfg=model_config('1.2b'))            # the config alone: the 1b's weights are 4 GB
    with pytest.warns(UserWarning, match=r"differs from our '1b' preset .* in num_hidden_layers \(released 28, ours 26\), "
                                         r"intermediate_size \(released 5120, ours 4096\)"):
        with pytest.raises(FileNotFoundError, match='no \\*.safetensors'): load('MLMvsCLM/1b-mlm40-42k')
    torch.manual_seed(0)
    _hub_release(tmp_path, 'tiny-clm-1k', model=build_model('tiny', num_hidden_layers=2))
    with pytest.warns(UserWarning, match=r"in num_hidden_layers \(released 2, ours 4\);"):
        assert load('MLMvsCLM/tiny-clm-1k').config.num_hidden_layers == 2
    _hub_release(tmp_path, 'tiny-mlm40-1k', model=build_model('tiny'))
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter('error')
        load('MLMvsCLM/tiny-mlm40-1k')                                             # the same shape: nothing to say
