"""The transformer (`mlmclm.model.transformer`) on its GPU path, checked on a CPU: the attention backend from the
compute dtype (flash only for half precision), flash-attn's import failure recorded, SDPA's grouped-query attention
under a mask (issue 25); the flash kernel resolved when a layer moves, so that a compiled block is one graph without
flash-attn, and batches of other document layouts reuse the compiled blocks (issue 33)."""
import sys

import pytest
import torch
import torch.nn.functional as F

import mlmclm.model.transformer as model_module
from mlmclm.base.configs import ConfigError
from mlmclm.finetuning.loop import packed_layout
from mlmclm.model.transformer import _varlen_kernels, attention_kernel, build_model, default_backend, reference_varlen
from mlmclm.model.sizes import model_config
from mlmclm.model.transformer import Attention, Block, Rotary, host_layout
from mlmclm.pretraining.objectives import lm_loss, make_batch
from mlmclm.protocol.schedules import Phase


# ------------------------------------ the GPU path, checked on a CPU (issue 25): the attention backend, flash-attn, GQA
@pytest.fixture
def fake_gpu(monkeypatch):
    "A CUDA device of compute capability 9.0 with a variable-length kernel, as far as backend choice can tell."
    monkeypatch.setattr(torch.cuda, 'get_device_capability', lambda device=None: (9, 0))
    monkeypatch.setattr(torch.cuda, 'is_bf16_supported', lambda *a, **k: True)
    monkeypatch.setattr(model_module, 'varlen_kernel', lambda: reference_varlen)


@pytest.mark.usefixtures('one_thread')   # tiny models: one thread is faster (conftest.py)
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


@pytest.mark.usefixtures('one_thread')   # tiny models: one thread is faster (conftest.py)
def test_flash_path_refuses_fp32_inputs():
    model = build_model('tiny', vocab_size=97, attn_backend='flash')
    for block in model.model.layers: block.self_attn.varlen_impl = lambda q, *a: q   # stands for a GPU kernel
    with pytest.raises(ConfigError, match="attn_backend='flash' takes fp16 or bf16 inputs, not torch.float32"):
        model(torch.randint(0, 97, (1, 8)))


@pytest.mark.usefixtures('one_thread')   # tiny models: one thread is faster (conftest.py)
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


@pytest.mark.usefixtures('one_thread')   # tiny models: one thread is faster (conftest.py)
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


# ---------------------------- issue 33 item 8: the kernel is resolved when a layer moves, not inside the compiled block
@pytest.fixture
def torch_varlen_on_cpu():
    "torch's varlen op (what runs on a GPU without flash-attn) given a CPU kernel: the reference, behind the custom op."
    lib = torch.library.Library('torch_attn', 'IMPL')
    def cpu(q, k, v, cu_q, cu_k, max_q, max_k, is_causal=False, scale=None, window_size=None, enable_gqa=False,
            seqused_k=None, block_table=None, num_splits=None):
        if k.shape[1] != q.shape[1]: k, v = (t.repeat_interleave(q.shape[1] // k.shape[1], 1) for t in (k, v))
        causal = is_causal or list(window_size or []) == [-1, 0]
        out = reference_varlen(q, k, v, cu_q, max_q, causal)
        return out, torch.zeros(q.shape[1], q.shape[0]), torch.zeros(2, dtype=torch.uint64)
    lib.impl('_varlen_attn', cpu, 'CPU')
    yield model_module._varlen_kernels()[0]
    lib._destroy()


def _compiled_block_graphs(kernel_of_device) -> dict:
    "Graphs and graph breaks of one compiled flash block whose layers resolve their kernel with `kernel_of_device`."
    from torch._dynamo.utils import counters
    torch._dynamo.reset(); counters.clear()
    cfg = model_config('tiny', attn_backend='flash')
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(model_module, 'layer_kernel', kernel_of_device)
        block = Block(cfg).to('cpu')
    docs = torch.tensor([[0] * 4 + [1] * 4] * 2)
    cos, sin = Rotary(cfg)(torch.arange(8)[None])
    block.compile(backend='eager')
    with torch.autocast('cpu', dtype=torch.bfloat16):
        block(torch.randn(2, 8, cfg.hidden_size), cos, sin, False, host_layout(None, docs))
    out = dict(graphs=counters['stats']['unique_graphs'], breaks=sum(counters['graph_break'].values()))
    torch._dynamo.reset()
    return out


def test_a_compiled_flash_block_is_one_graph_without_flash_attn(torch_varlen_on_cpu):
    "Before: `varlen_kernel()` ran inside the block, `import flash_attn` failed under the trace: 8 graphs, 5 breaks."
    assert model_module.importlib.util.find_spec('flash_attn') is None      # the README's default install
    inside = _compiled_block_graphs(lambda device: lambda *a: model_module.varlen_kernel()(*a))   # resolved per call
    resolved = _compiled_block_graphs(lambda device: model_module.varlen_kernel())                 # resolved on `to`
    assert inside['breaks'] > 0 and inside['graphs'] > 1, inside
    assert resolved == dict(graphs=1, breaks=0), resolved


def test_the_kernel_follows_the_layer_to_its_device(monkeypatch):
    seen = []
    monkeypatch.setattr(model_module, 'layer_kernel', lambda device: seen.append(torch.device(device).type) or reference_varlen)
    layer = Attention(model_config('tiny', attn_backend='flash'))
    layer.to('meta'); layer.to_empty(device='cpu')
    assert seen == ['cpu', 'meta', 'cpu'] and layer.kernel is reference_varlen


# Issue 33.
def test_batches_with_other_documents_reuse_the_compiled_blocks(torch_varlen_on_cpu):
    "Before: each new longest-document length and each new document count recompiled the blocks (2 recompiles here)."
    from torch._dynamo.utils import counters, guard_failures
    from mlmclm.model.transformer import compile_blocks
    torch._dynamo.reset()
    model = build_model('tiny', attn_backend='flash')
    for block in model.model.layers: block.self_attn.varlen_impl = torch_varlen_on_cpu
    compile_blocks(model, backend='eager')
    info = dict(mask_token_id=2, vocab_size=8192, special_ids=[0, 1, 2])
    seen = []
    for docs in ([0] * 10 + [1] * 22, [0] * 20 + [1] * 12, [0] * 5 + [1] * 7 + [2] * 20, [0] * 32):
        rows = dict(input_ids=torch.randint(3, 8192, (2, 32)), document_ids=torch.tensor([docs] * 2))
        b = make_batch(rows, Phase('mlm', 1, 0.4), info, (1.0, 0.0, 0.0), seed=0, first_row=0)
        seen.append((b['max_seqlen'], len(b['cu_seqlens'])))
        with torch.no_grad(), torch.autocast('cpu', dtype=torch.bfloat16): lm_loss(model, b)   # forward: the op has no CPU backward
    assert len(set(seen)) == 4                                                   # every batch laid out differently
    recompiles, breaks = sum(map(len, guard_failures.values())), sum(counters['graph_break'].values())
    torch._dynamo.reset()
    assert (recompiles, breaks) == (0, 0), (recompiles, breaks)
