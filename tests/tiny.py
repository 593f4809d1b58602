"""Tiny fine-tuning settings and checkpoints that many tests share (the cheapest ones that still run the real code)."""
import torch

from mlmclm.protocol.runs import FinetuneConfig


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
