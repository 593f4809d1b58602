"""Our checkpoints in plain transformers: the fill-mask pipeline opens a checkpoint once `save`, `load` or
`register_with_transformers` has registered the masked-LM view of Llama; importing `mlmclm.model.checkpoints` registers nothing."""
import subprocess
import sys
from pathlib import Path

import torch
import transformers

from mlmclm.data.tokenizers import load_tokenizer
from mlmclm.model.transformer import build_model
from mlmclm.model.checkpoints import save


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


def test_importing_the_model_changes_nothing_in_transformers():
    "Registration is a call (`save` and `load` make it), not a side effect of `import mlmclm.model.checkpoints`."
    code = ("from transformers import AutoModelForMaskedLM, LlamaConfig\n"
            "import mlmclm.model.checkpoints\n"
            "cfg = LlamaConfig(vocab_size=16, hidden_size=8, intermediate_size=16, num_hidden_layers=1,\n"
            "                  num_attention_heads=2, num_key_value_heads=1)\n"
            "try: AutoModelForMaskedLM.from_config(cfg); print('registered at import')\n"
            "except ValueError: pass\n"
            "import tempfile; mlmclm.model.checkpoints.save(mlmclm.model.transformer.build_model('tiny'), tempfile.mkdtemp())   # registers\n"
            "print(type(AutoModelForMaskedLM.from_config(cfg)).__name__)")
    out = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, cwd=Path(__file__).parents[2])
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ['LlamaForMaskedLM'], out.stdout
