"""Tiny pretraining and fine-tuning settings and checkpoints that many tests share (the cheapest ones that still run the
real code)."""
from pathlib import Path

import torch

from mlmclm.base.configs import build_config
from mlmclm.base.files import read_jsonl
from mlmclm.protocol.runs import FinetuneConfig, PretrainConfig

TINY_PRETRAIN = dict(size='tiny', seq_len=32, batch_size=4, warmup_steps=1, decay_steps=1, data='embedded',
                     progress=False, prefetch=0, log_every=1)   # schedule and steps are each test's own
NEW_SETTINGS = dict(lr=1e-3, adam_beta2=0.5, weight_decay=0.5)   # a run's new optimizer settings (the attack's N2, N3)
# 32 tokens a micro-batch: rare masks leave some empty (the third attack's N18)
SMALL_BATCH_MLM = dict(schedule='mlm', total_steps=40, seq_len=16, batch_size=2, warmup_steps=1, decay_steps=1,
                       checkpoint_steps='')


def tiny_run_cfg(tmp, **kw):
    "The third fault attack's $TINY run `a` in `tmp`: CLM, 4 steps, states at steps 1, 2 and 4."
    values = {**TINY_PRETRAIN, 'schedule': 'clm', 'total_steps': 4, 'out_dir': str(tmp), 'run_id': 'a'}
    return build_config(PretrainConfig, {**values, **kw})


def metrics_of(folder) -> dict:
    "A run's metrics rows by step."
    return {r['step']: r for r in read_jsonl(Path(folder)/'metrics.jsonl')}


def tiny_cfg(tmp_path, **kw):
    "The cheapest fine-tuning sweep: one embedded task, one LR, one seed, one step, a few evaluation examples."
    values = dict(tasks='rt_sentiment', lrs='1e-3', seeds='0', max_steps=1, eval_every=1, batch_size=4,
                  micro_batch_size=4, max_eval_examples=4, results=str(tmp_path/'results.jsonl'), progress=False)
    return FinetuneConfig(**{**values, **kw})


def tiny_checkpoint(folder, run_id='r', step=20, fill=None, seed=0):
    "A saved tiny model with pretraining metadata, as `pretrain` keeps it under checkpoints/step-<N>."
    from mlmclm.data.tokenizers import load_tokenizer
    from mlmclm.model.transformer import build_model
    from mlmclm.model.checkpoints import save
    tok = load_tokenizer('embedded')
    torch.manual_seed(seed)
    model = build_model('tiny', vocab_size=len(tok), bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                        pad_token_id=tok.pad_token_id, mask_token_id=tok.mask_token_id)
    if fill is not None:
        with torch.no_grad():
            for p in model.parameters(): p.fill_(fill)
    return save(model, folder, tokenizer=tok, metadata=dict(run_id=run_id, step=step, objective='mlm'))
