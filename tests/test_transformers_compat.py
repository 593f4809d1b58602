"""Our checkpoints in plain transformers: fill-mask pipeline after `import mlmclm.model`."""
import torch
import transformers

import mlmclm.model  # noqa: F401  (registers the masked-LM view of Llama checkpoints)
from mlmclm.data import load_tokenizer
from mlmclm.model import build_model, save


def test_fill_mask_pipeline_opens_an_mlm_checkpoint(tmp_path):
    tok = load_tokenizer('embedded')
    torch.manual_seed(0)
    model = build_model('tiny', vocab_size=len(tok), mask_token_id=tok.mask_token_id,
                        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    save(model, tmp_path, tokenizer=tok, is_causal=False)
    fill = transformers.pipeline('fill-mask', model=str(tmp_path))
    preds = fill(f'To be, or not to {tok.mask_token}', top_k=3)
    assert len(preds) == 3 and all('token_str' in p for p in preds)
    # the pipeline's top token is the argmax of our own model's logits at the mask
    ids = tok(f'To be, or not to {tok.mask_token}', return_tensors='pt')['input_ids']
    with torch.no_grad():
        ours = model.eval()(ids, is_causal=False).logits[0, (ids[0] == tok.mask_token_id).nonzero()[0, 0]]
    assert preds[0]['token'] == int(ours.argmax())
