"""The arithmetic of `mlmclm.model.sizes` is the model's: parameter counts from the shapes equal the built model's, the FLOPs
equal the meta-model count they replaced, the stored activation and logit bytes equal what `pretraining/00_objectives` measures,
and the planner's and the figures' arithmetic runs without torch."""
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from mlmclm.model.transformer import Transformer
from mlmclm.model.memory import activation_bytes, logit_bytes
from mlmclm.model.sizes import (ACTIVATION_BYTES, LOGIT_BYTES, MODEL_SIZES, flops_per_token, model_config,
                                param_counts, stored_activation_bytes)

ROOT = Path(__file__).resolve().parents[2]
VARIANTS = [dict(), dict(tie_word_embeddings=True), dict(attention_bias=True), dict(num_key_value_heads=1)]


def _meta(cfg) -> Transformer:
    with torch.device('meta'): return Transformer(cfg)


@pytest.mark.parametrize('size', list(MODEL_SIZES))
@pytest.mark.parametrize('variant', VARIANTS, ids=lambda v: ','.join(v) or 'as-named')
def test_parameter_counts_are_the_built_models(size, variant):
    cfg = model_config(size, **variant)
    m, n = _meta(cfg), param_counts(cfg)
    assert n['all'] == sum(p.numel() for p in m.parameters())                        # a tied head counted once
    assert n['block'] == sum(p.numel() for p in m.model.layers[0].parameters())
    assert n['embed'] == m.model.embed_tokens.weight.numel() and n['head'] == m.lm_head.weight.numel()
    assert n['out'] == cfg.hidden_size + (0 if cfg.tie_word_embeddings else m.lm_head.weight.numel())
    assert n['body'] == m.num_parameters() - cfg.vocab_size * cfg.hidden_size      # what the planner's fine-tuning cost used


def _meta_flops(cfg, seq_len, objective='clm', mask_ratio=0.4, sparse_head=True, attn_len=None) -> float:
    "The count `flops_per_token` replaced, from a meta model (mlmclm before the sizes module)."
    m = _meta(cfg)
    embed = head = cfg.vocab_size * cfg.hidden_size
    body = m.num_parameters(lm_head=True) - (0 if cfg.tie_word_embeddings else embed) - head
    head_share = mask_ratio if (objective == 'mlm' and sparse_head) else 1.0
    attn = 12 * cfg.num_hidden_layers * (seq_len if attn_len is None else attn_len) * cfg.num_attention_heads * cfg.head_dim
    return 6 * (body + head_share * head) + attn


@pytest.mark.parametrize('size', list(MODEL_SIZES))
def test_flops_per_token_are_the_meta_models_bit_for_bit(size):
    for variant in VARIANTS:
        cfg = model_config(size, **variant)
        for kw in (dict(), dict(objective='mlm'), dict(objective='mlm', mask_ratio=0.2, sparse_head=False),
                   dict(objective='mlm', attn_len=301.7)):
            assert flops_per_token(cfg, 1024, **kw) == _meta_flops(cfg, 1024, **kw), (variant, kw)


def _check_stored(size: str) -> None:
    for kernel in ('sdpa', 'eager', 'flash'):
        cfg = model_config(size, attn_backend=kernel)
        for (bf16, checkpointed), stored in ACTIVATION_BYTES[(size, kernel)].items():
            assert activation_bytes(cfg, bf16, checkpointed) == stored == stored_activation_bytes(cfg, bf16, checkpointed), \
                (size, kernel, bf16, checkpointed)


def test_stored_measurements_are_the_measured_ones_tiny():
    assert {k for k, _ in ACTIVATION_BYTES} == set(MODEL_SIZES)
    _check_stored('tiny')
    assert {k: logit_bytes(*k) for k in LOGIT_BYTES} == LOGIT_BYTES


@pytest.mark.slow
@pytest.mark.parametrize('size', [s for s in MODEL_SIZES if s != 'tiny'])
def test_stored_measurements_are_the_measured_ones(size):
    "Two blocks of the paper's widths, four forward passes per setting on the CPU: about 10 s a size."
    _check_stored(size)


def test_the_planners_and_the_figures_arithmetic_needs_no_torch():
    code = ("import sys\n"
            "from mlmclm.model.sizes import fit_settings, flops_per_token, memory_estimate, memory_line, param_counts\n"
            "from mlmclm.report.figures import paper_flops_per_step\n"
            "fit = fit_settings('1b', objective='clm', grad_accum=24)\n"
            "print(memory_line(fit), fit['changed'] == {}, paper_flops_per_step('610m', 'mlm') > 0, param_counts('210m')['all'])\n"
            "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))")
    out = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    line, light = out.stdout.strip().splitlines()
    assert light == '[]' and 'compiled blocks' in line and 'True True' in line, out.stdout   # 1b: DDP fits (issue 33)
