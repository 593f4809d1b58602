"""The GPU path, checked on a CPU (issue 25): peak FLOP/s by exact device name, the attention FLOPs of real document
lengths, the attention backend from the compute dtype, flash-attn's import failure recorded, packed fine-tuning
without host syncs, the true longest document as `max_seqlen`, GQA under a mask, and the memory estimate against
the measured peak of small shapes."""
import sys

import pytest
import torch
import torch.nn.functional as F

import mlmclm.model.transformer as model_module
from mlmclm.base.configs import ConfigError
from mlmclm.protocol.paper import ADAMW
from mlmclm.model.transformer import (HostSyncs, Transformer, _varlen_kernels, attention_kernel, build_model,
                                      default_backend, host_layout, layout_of, reference_varlen)
from mlmclm.model.heads import TaskModel
from mlmclm.model.heads import IGNORE
from mlmclm.model.memory import MEASURED
from mlmclm.base.devices import MemoryMeter, device_peak_flops
from mlmclm.base.optim import adamw
from mlmclm.pretraining.objectives import attention_span, clm_labels, lm_loss
from mlmclm.model.sizes import GIB, fit_settings, flops_per_token, memory_estimate, model_config
from mlmclm.finetuning.batches import collate_packed, head_loss
from mlmclm.finetuning.loop import packed_layout

pytestmark = pytest.mark.usefixtures('one_thread')


def test_peak_flops_match_exact_device_names(monkeypatch):
    "Substring matching gave an H100 PCIe the SXM part's 989 TFLOP/s and a GH200 nothing."
    for name, peak in (('NVIDIA H100 PCIe', 756.5e12), ('NVIDIA H100 NVL', 835.5e12), ('NVIDIA GH200 480GB', 989.4e12),
                       ('NVIDIA H100 80GB HBM3', 989.4e12), ('AMD Instinct MI250X', 191.5e12)):
        monkeypatch.setattr(torch.cuda, 'get_device_name', lambda device=None, n=name: n)
        assert device_peak_flops('cuda') == peak, name
    monkeypatch.setattr(torch.cuda, 'get_device_name', lambda device=None: 'NVIDIA H100 SXM5 64GB')
    with pytest.warns(RuntimeWarning, match="unknown device 'NVIDIA H100 SXM5 64GB': no MFU"):
        assert device_peak_flops('cuda') is None


def test_attention_flops_from_the_real_document_lengths():
    cfg = model_config('610m')
    docs = torch.tensor([[0] * 1000 + [1] * 24, [2] * 100 + [3] * 924])
    span = attention_span(docs)
    assert span == pytest.approx((1000**2 + 24**2 + 100**2 + 924**2) / 2048)
    conv, real = flops_per_token(cfg, 1024), flops_per_token(cfg, 1024, attn_len=span)
    assert real < conv and conv - real == pytest.approx(12 * 26 * (1024 - span) * 18 * 64)


@pytest.fixture
def fake_gpu(monkeypatch):
    "A CUDA device of compute capability 9.0 with a variable-length kernel, as far as backend choice can tell."
    monkeypatch.setattr(torch.cuda, 'get_device_capability', lambda device=None: (9, 0))
    monkeypatch.setattr(torch.cuda, 'is_bf16_supported', lambda *a, **k: True)
    monkeypatch.setattr(model_module, 'varlen_kernel', lambda: reference_varlen)


def test_flash_backend_only_for_half_precision(fake_gpu):
    "fp32 never reaches the flash kernels: the model's default, fine-tuning's packed layout, the benchmark's ablation."
    from mlmclm.bench.throughput import _resolve_options, ablation_variants
    cuda = torch.device('cuda')
    assert default_backend(cuda, torch.bfloat16) == 'flash' and default_backend(cuda, torch.float32) == 'sdpa'
    assert packed_layout(cuda, 128, 'pure_bf16') == ('flash', None)
    assert packed_layout(cuda, 128, 'amp_bf16') == ('flash', None)           # autocast: the kernels see bf16
    assert packed_layout(cuda, 128, 'fp32') == ('sdpa', 128)
    assert _resolve_options(cuda, {})['attn_backend'] == 'flash'
    assert _resolve_options(cuda, ablation_variants(cuda, 'mlm')['no bf16'])['attn_backend'] == 'sdpa'
    with pytest.raises(ConfigError, match="attn_backend='flash' needs bf16"):
        _resolve_options(cuda, dict(bf16=False, attn_backend='flash'))


def test_flash_path_refuses_fp32_inputs():
    model = build_model('tiny', vocab_size=97, attn_backend='flash')
    for block in model.model.layers: block.self_attn.varlen_impl = lambda q, *a: q   # stands for a GPU kernel
    with pytest.raises(ConfigError, match="attn_backend='flash' takes fp16 or bf16 inputs, not torch.float32"):
        model(torch.randint(0, 97, (1, 8)))


def test_a_flash_attn_that_does_not_import_is_recorded(tmp_path, monkeypatch):
    "An ABI mismatch makes `import flash_attn` fail; the fallback to torch's kernel is warned about and recorded."
    pkg = tmp_path/'flash_attn'; pkg.mkdir()
    (pkg/'__init__.py').write_text("raise ImportError('flash_attn_2_cuda.so: undefined symbol: _ZN3c104cuda9SetDeviceEi')")
    monkeypatch.syspath_prepend(str(tmp_path)); monkeypatch.delitem(sys.modules, 'flash_attn', raising=False)
    _varlen_kernels.cache_clear()
    try:
        with pytest.warns(RuntimeWarning, match='flash-attn is installed but does not import'):
            record = attention_kernel('flash', 'cuda')
        assert 'undefined symbol' in record['flash_attn_problem'] and 'rebuild it for torch' in record['flash_attn_problem']
        assert record['kernel'] is None or record['kernel'].startswith('torch.nn.attention.varlen')
    finally: _varlen_kernels.cache_clear()


def _packed(layers: int, lengths=(5, 9, 3, 7)):
    torch.manual_seed(0)
    model = TaskModel(build_model('tiny', vocab_size=97, attn_backend='flash', num_hidden_layers=layers), 'embedding')
    feats = [dict(input_ids=torch.randint(3, 97, (n,)).tolist()) for n in lengths]
    return model, collate_packed(feats, 0, budget=12, strategy='first-fit')   # rows of up to 12 tokens, padded


def test_packed_fine_tuning_makes_no_host_sync():
    "Before: a boolean gather and scatter in every layer (213 host syncs a forward + backward at 26 layers)."
    for layers in (2, 8):
        model, b = _packed(layers)
        assert b['indices'] is not None                       # the rows are padded: there is something to unpad
        with HostSyncs() as shipped:
            model(b['input_ids'], b['attention_mask'], b['document_ids'], layout=layout_of(b)).sum().backward()
        with HostSyncs() as on_device:
            model(b['input_ids'], b['attention_mask'], b['document_ids']).sum().backward()
        assert shipped.count == 0, dict(shipped.ops)
        assert on_device.count <= 2, dict(on_device.ops)      # the layout worked out once per pass, not per layer


def test_max_seqlen_is_the_longest_document_not_the_row():
    model, b = _packed(2, lengths=(3, 3, 2, 3, 3))          # rows of 11 and 3 tokens
    seen = []
    def kernel(q, k, v, cu, max_len, causal): seen.append(max_len); return reference_varlen(q, k, v, cu, max_len, causal)
    for block in model.model.layers: block.self_attn.varlen_impl = kernel
    model.to(torch.bfloat16)(b['input_ids'], b['attention_mask'], b['document_ids'], layout=layout_of(b))   # kernels' dtype
    assert b['input_ids'].shape[1] == 11 and seen == [3, 3] and all(isinstance(m, int) for m in seen)   # an int (symbolic when compiled)


def test_sdpa_repeats_keys_and_values_under_a_mask(monkeypatch):
    "With a mask, SDPA's GQA runs only on the math kernel: keys and values go repeated; without one, unrepeated."
    calls, sdpa = [], F.scaled_dot_product_attention
    def recording(q, k, v, attn_mask=None, is_causal=False, enable_gqa=False, **kw):
        calls.append((attn_mask is not None, k.shape[1], enable_gqa))
        return sdpa(q, k, v, attn_mask=attn_mask, is_causal=is_causal, enable_gqa=enable_gqa, **kw)
    monkeypatch.setattr(model_module.F, 'scaled_dot_product_attention', recording)
    model = build_model('tiny', vocab_size=97, num_hidden_layers=1)               # 4 query heads, 2 key/value heads
    x = torch.randint(0, 97, (2, 8))
    model(x, is_causal=True); model(x, document_ids=torch.tensor([[0] * 4 + [1] * 4] * 2))
    assert calls == [(False, 2, True), (True, 4, False)]


def _measured_peak_gib(cfg, micro_batch, seq_len, objective, ce_chunk=0, grad_ckpt=False, grad_accum=1, bf16=False):
    "`MemoryMeter`'s peak over two optimizer steps on the CPU, plus the weights built before it."
    torch.manual_seed(0)
    model = Transformer(cfg).train(); model.set_gradient_checkpointing(grad_ckpt)
    opt = adamw(model, 1e-3, ADAMW)
    docs = torch.zeros(micro_batch, seq_len, dtype=torch.long); docs[:, seq_len // 3:] = 1
    with MemoryMeter() as mm:
        for _ in range(2):
            for _ in range(grad_accum):
                ids = torch.randint(3, cfg.vocab_size, (micro_batch, seq_len))
                labels = clm_labels(ids, docs) if objective == 'clm' else torch.where(torch.rand(ids.shape) < 0.4, ids, IGNORE)
                with torch.autocast('cpu', dtype=torch.bfloat16, enabled=bf16):
                    batch = dict(input_ids=ids, document_ids=docs, labels=labels, is_causal=objective == 'clm')
                    (lm_loss(model, batch, ce_chunk=ce_chunk)[0] / grad_accum).backward()
            opt.step(); opt.zero_grad(set_to_none=True)
    return (mm.peak + sum(4 * p.numel() for p in model.parameters())) / GIB


@pytest.mark.parametrize('run', [dict(objective='mlm'), dict(objective='clm', bf16=True),
                                 dict(objective='mlm', grad_ckpt=True, grad_accum=2),
                                 dict(objective='clm', ce_chunk=64)])
def test_memory_estimate_matches_the_measured_peak(run):
    cfg = model_config('tiny', hidden_size=256, num_attention_heads=4, num_key_value_heads=2, head_dim=64,
                       intermediate_size=768, num_hidden_layers=2, vocab_size=2048, attn_backend='sdpa')
    est = memory_estimate(cfg, 'none', 1, 4, 64, attn_backend='sdpa', compiled=False, **MEASURED, **run)   # eager, as measured
    measured = _measured_peak_gib(cfg, 4, 64, **run)
    assert 0.85 < est['peak_gib'] / measured < 1.2, (est['peak_gib'] * 1024, measured * 1024)


def test_fsdp2_with_accumulation_keeps_unsharded_fp32_gradients():
    one, many = (memory_estimate('1b', 'fsdp2', 8, grad_accum=a) for a in (1, 24))
    assert (many['peak_gib'] - one['peak_gib']) * GIB == pytest.approx(4 * one['parameters'])
    ddp = memory_estimate('1b', 'ddp', 8)
    assert ddp['gradients_gib'] == pytest.approx(2 * 4 * ddp['parameters'] / GIB)   # the gradients and DDP's buckets


def test_fit_settings_picks_what_fits_an_80gb_card():
    fit = fit_settings('1b', objective='clm', grad_accum=24)                 # compiled blocks (issue 33): DDP fits as is
    assert fit['peak_gib'] <= fit['budget_gib'] and fit['changed'] == {}
    assert fit_settings('1.2b', objective='clm', grad_accum=24, compiled=False)['changed'] == {'strategy': 'fsdp2'}
    assert fit_settings('210m', grad_accum=24)['changed'] == {}
    assert fit_settings('1b', objective='clm', ce_chunk=512, grad_accum=24)['ce_chunk'] == 512   # what is given stays
    with pytest.raises(ConfigError, match='does not fit'):
        fit_settings('1b', micro_batch=512)


def test_pretraining_batches_carry_their_layout():
    "`make_batch` ships the documents' offsets and longest length: the flash path needs no sync to find them."
    from mlmclm.pretraining.objectives import make_batch
    from mlmclm.protocol.schedules import Phase
    docs = torch.tensor([[0] * 40 + [1] * 24, [2] * 10 + [3] * 54])
    rows = dict(input_ids=torch.randint(3, 97, (2, 64)), document_ids=docs)
    ids = dict(mask_token_id=2, vocab_size=97, special_ids=[0, 1, 2])
    batch = make_batch(rows, Phase('clm', 1), ids, (1.0, 0.0, 0.0), seed=0, first_row=0)
    assert batch['cu_seqlens'].tolist() == [0, 40, 64, 74, 128] and batch['max_seqlen'] == 54
    model = build_model('tiny', vocab_size=97, attn_backend='flash', num_hidden_layers=2)
    seen = []
    def kernel(q, k, v, cu, max_len, causal): seen.append((cu.tolist(), max_len)); return q
    for block in model.model.layers: block.self_attn.varlen_impl = kernel
    with HostSyncs() as s: lm_loss(model.to(torch.bfloat16), batch)
    assert seen == [([0, 40, 64, 74, 128], 54)] * 2 and s.count == 0, dict(s.ops)
