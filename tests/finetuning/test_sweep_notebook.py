"""Fine-tuning through its papermill notebook on a pretrained tiny checkpoint, and clear errors on bad input."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from mlmclm.base.configs import ConfigError, build_config
from mlmclm.base.files import project_root, read_jsonl
from mlmclm.data.tokenizers import load_tokenizer
from mlmclm.protocol.runs import FinetuneConfig
from mlmclm.finetuning.loop import check_finetune_config
from mlmclm.results.store import load_results
from mlmclm.model.transformer import build_model
from mlmclm.model.checkpoints import save

ROOT = project_root()


@pytest.fixture(scope='module')
def checkpoint(tmp_path_factory):
    tok = load_tokenizer('embedded')
    torch.manual_seed(0)
    model = build_model('tiny', vocab_size=len(tok), bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                        pad_token_id=tok.pad_token_id, mask_token_id=tok.mask_token_id)
    folder = tmp_path_factory.mktemp('ckpt')/'step-10'
    save(model, folder, tokenizer=tok, metadata=dict(run_id='tiny-mlm40-42k', step=10, objective='mlm', mask_ratio=0.4))
    return folder


def test_papermill_finetunes_all_four_families(checkpoint, tmp_path):
    pm = Path(sys.executable).with_name('papermill')
    store = tmp_path/'results.jsonl'
    out = subprocess.run([str(pm), 'nbs/03b_finetune.ipynb', str(tmp_path/'ft.ipynb'), '-p', 'checkpoint', str(checkpoint),
                          '-p', 'lrs', '1e-3', '-p', 'seeds', '0,1', '-p', 'max_steps', '4', '-p', 'eval_every', '2',
                          '-p', 'batch_size', '8', '-p', 'micro_batch_size', '8',
                          '-p', 'max_eval_examples', '20', '-p', 'results', str(store)],
                         capture_output=True, text=True, cwd=ROOT, timeout=900,
                         env=dict(os.environ, OMP_NUM_THREADS='1'))   # tiny model: one thread, no oversubscription on shared CI
    assert out.returncode == 0, out.stderr[-3000:]
    res = load_results(store)
    assert sorted(res.family.unique()) == ['IR', 'QA', 'SC', 'TC'] and len(res) == 8
    assert set(res.checkpoint_name) == {'tiny-mlm40-42k-step-10'} and set(res.pretrain_objective) == {'mlm'}   # run and step
    assert res.test_score.between(0, 1).all() and res.steps.eq(4).all()
    assert res[res.family == 'QA'].test_exact_match.between(0, 1).all()
    printed = ''.join(''.join(o.get('text', '')) for c in json.loads((tmp_path/'ft.ipynb').read_text())['cells']
                      for o in c.get('outputs', []))
    assert 'score (%)' in printed and '95% CI' in printed


@pytest.mark.parametrize('values, message', [
    (dict(tasks='SC,sentiment'), "unknown task 'sentiment'"),
    (dict(lrs=''), "lrs='' is empty"),
    (dict(lrs='1e-4,-1'), "lrs='1e-4,-1' holds -1; learning rates are numbers in (0, 1]"),
    (dict(checkpoint='./runs/no-such-checkpoint'), "checkpoint='./runs/no-such-checkpoint' does not exist"),
    (dict(batch_size=32, micro_batch_size=5), 'must be a multiple of micro_batch_size=5'),
])
def test_bad_input_fails_before_training(values, message):
    with pytest.raises(ConfigError) as err:
        check_finetune_config(build_config(FinetuneConfig, values))
    assert message in str(err.value)


def test_unknown_parameter_is_refused():
    with pytest.raises(ConfigError, match="unknown parameter 'learning_rate'"):
        build_config(FinetuneConfig, dict(learning_rate=1e-4))
