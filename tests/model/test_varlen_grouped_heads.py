"""Issue 48: keys and values reach torch's varlen kernel unrepeated where it takes grouped heads (checked here through
torch's op given CPU kernels, `mlmclm.model.memory.gpu_varlen_on_cpu`; on a GPU by the `#| gpu` cell of
`nbs/model/01_transformer.ipynb`), and the CPU kernels read the op's call by its schema's names, whatever release's
argument order it has."""
import inspect

import pytest
import torch
from torch.nn.attention.varlen import varlen_attn

import mlmclm.model.transformer as model_module
from mlmclm.model.memory import _cpu_varlen_backward, _cpu_varlen_forward, _varlen_grads, gpu_varlen_on_cpu
from mlmclm.model.sizes import model_config
from mlmclm.model.transformer import build_model, grouped_heads, reference_varlen, torch_varlen_kernel

G = torch.Generator().manual_seed(0)
Q, K, V = (torch.randn(14, h, 8, generator=G) for h in (4, 2, 2))     # 4 query heads, 2 key/value heads
CU = torch.tensor([0, 5, 14], dtype=torch.int32)


def _grads(kernel, causal=True):
    q, k, v = (t.clone().requires_grad_() for t in (Q, K, V))
    out = kernel(q, k, v, CU, 9, causal)
    out.square().sum().backward()
    return [out.detach(), q.grad, k.grad, v.grad]


def test_grouped_keys_and_values_give_what_repeated_ones_give():
    seen = []
    with gpu_varlen_on_cpu():
        def watching(q, k, *a, **kw): seen.append(k.shape[1]); return varlen_attn(q, k, *a, **kw)
        watching.__signature__ = inspect.signature(varlen_attn)   # the release's keywords, seen through
        for causal in (True, False):
            grouped, repeated = (_grads(torch_varlen_kernel(watching, g), causal) for g in (True, False))
            reference = _grads(lambda q, k, v, cu, m, c: reference_varlen(q, k, v, cu, m, c), causal)
            for a, b, c in zip(grouped, repeated, reference):
                torch.testing.assert_close(a, b); torch.testing.assert_close(a, c)   # alike, and right
    assert seen == [2, 4, 2, 4]   # unrepeated, then repeated, for each mode


def test_a_release_without_the_keyword_gets_grouped_heads_only_where_its_kernel_takes_them(monkeypatch):
    def takes(q, k, v, cu_q, cu_k, max_q, max_k, window_size=(-1, -1)):      # a release without `enable_gqa`
        return reference_varlen(q, k, v, cu_q, max_q, window_size == (-1, 0))
    def refuses(q, k, v, cu_q, cu_k, max_q, max_k, window_size=(-1, -1)):
        if k.shape[1] != q.shape[1]: raise RuntimeError('Number of heads in key/value must equal those of the query')
        return reference_varlen(q, k, v, cu_q, max_q, window_size == (-1, 0))
    assert torch_varlen_kernel(takes).grouped is False                      # the release does not say: repeat
    assert grouped_heads('cpu', takes) and not grouped_heads('cpu', refuses)
    # on CUDA, a layer gets the grouped kernel once the probe says so (no GPU here: the probe is stood in for)
    monkeypatch.setattr(model_module.torch.cuda, 'is_available', lambda: True)
    monkeypatch.setattr(model_module, 'varlen_kernel', lambda: torch_varlen_kernel(takes))
    monkeypatch.setattr(model_module, 'grouped_heads', lambda device: True)
    model_module._cuda_kernel.cache_clear()
    try: assert model_module.layer_kernel('cuda').grouped is True
    finally: model_module._cuda_kernel.cache_clear()


def test_a_flash_model_on_torchs_op_trains_as_on_the_reference():
    "The whole model, grouped-query attention through torch's op (CPU kernels, forward and backward), bf16."
    torch.manual_seed(0)
    model = build_model(model_config('tiny', attn_backend='flash', num_attention_heads=4, num_key_value_heads=2))
    ids, docs = torch.randint(3, 100, (2, 16)), torch.tensor([[0] * 6 + [1] * 10, [0] * 16])
    def run(kernel):
        for block in model.model.layers: block.self_attn.varlen_impl = kernel
        model.zero_grad()
        with torch.autocast('cpu', dtype=torch.bfloat16): model(ids, document_ids=docs).logits.float().square().mean().backward()
        return {k: p.grad.clone() for k, p in model.named_parameters()}
    with gpu_varlen_on_cpu(): on_op = run(torch_varlen_kernel(varlen_attn, grouped=True))
    on_reference = run(reference_varlen)
    for k in on_reference: torch.testing.assert_close(on_op[k], on_reference[k], atol=2e-2, rtol=2e-2)


@pytest.fixture
def older_release_ops():
    "torch_attn's ops as a 2026 release declared them: KV-cache arguments between the window and `seqused_k`."
    lib = torch.library.Library('mlmclm_older_varlen', 'DEF')
    lib.define('fwd(Tensor query, Tensor key, Tensor value, Tensor cu_seq_q, Tensor cu_seq_k, SymInt max_q, SymInt max_k, '
               'bool is_causal=False, float? scale=None, SymInt[]? window_size=None, Tensor? k_cache=None, '
               'Tensor? v_cache=None, Tensor? cache_seqlens=None, Tensor? cache_batch_idx=None, Tensor? page_table=None, '
               'Tensor? seqused_k=None) -> (Tensor, Tensor, Tensor)')
    lib.define('bwd(Tensor grad_out, Tensor query, Tensor key, Tensor value, Tensor out, Tensor lse, Tensor cu_seq_q, '
               'Tensor cu_seq_k, SymInt max_q, SymInt max_k, bool is_causal, Tensor rng_state, float? scale=None, '
               'SymInt[]? window_size=None) -> (Tensor, Tensor, Tensor)')
    ops = torch.ops.mlmclm_older_varlen
    lib.impl('fwd', _cpu_varlen_forward(ops.fwd.default), 'CPU')
    lib.impl('bwd', _cpu_varlen_backward(ops.bwd.default), 'CPU')
    yield ops
    lib._destroy()


def test_the_cpu_kernels_read_any_releases_call_by_name(older_release_ops):
    ops = older_release_ops
    out, lse, rng = ops.fwd(Q, K, V, CU, CU, 9, 9, False, None, [-1, 0], None, None, None, None, None, None)
    torch.testing.assert_close(out, reference_varlen(Q, K, V, CU, 9, True))       # causal by its window
    assert lse.shape == (4, 14) and rng.dtype == torch.uint64
    grads = ops.bwd(2 * out, Q, K, V, out, lse, CU, CU, 9, 9, True, rng)
    for mine, want in zip(grads, _grads(lambda q, k, v, cu, m, c: reference_varlen(q, k, v, cu, m, c))[1:]):
        torch.testing.assert_close(mine, want)
    torch.testing.assert_close(_varlen_grads(2 * out, Q, K, V, CU, True)[1], grads[1])
