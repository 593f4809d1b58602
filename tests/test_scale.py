"""Issue 33, at the scale the package exists for: the flash kernel resolved outside compiled code (one graph per
block without flash-attn), MLM's masked positions shipped as indices (no host sync), the paper's 1b shape and the
release check, compiled activation tables, and the smoke that judges what it reports."""
import json

import pytest
import torch
import torch.nn.functional as F

import mlmclm.model as model_module
from mlmclm.model import Attention, Block, HostSyncs, Rotary, build_model, host_layout, reference_varlen
from mlmclm.objectives import IGNORE, lm_loss, make_batch
from mlmclm.sizes import model_config
from mlmclm.vocab import Phase


# --- item 8: the kernel is resolved when a layer moves, not inside the compiled block -------------------------------

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


# --- item 9: MLM's masked positions as indices from the CPU data path -----------------------------------------------

def _mlm_batch(B=2, T=16, V=50):
    rows = dict(input_ids=torch.randint(3, V, (B, T), generator=torch.Generator().manual_seed(0)),
                document_ids=torch.tensor([[0] * (T // 2) + [1] * (T - T // 2)] * B))
    info = dict(mask_token_id=2, vocab_size=V, special_ids=[0, 1, 2])
    return make_batch(rows, Phase('mlm', 1, 0.4), info, (1.0, 0.0, 0.0), seed=0, first_row=0)


def _boolean_loss(model, batch, ce_chunk=0):
    "The sparse MLM loss as it was: boolean indexing of the masked positions (forward and backward)."
    labels = batch['labels']; sel = labels != IGNORE
    kw = dict(is_causal=False, document_ids=batch['document_ids'])
    if ce_chunk:
        from mlmclm.objectives import chunked_cross_entropy
        h = model(batch['input_ids'], head=False, **kw).hidden_states
        return chunked_cross_entropy(h[sel], model.lm_head.weight, labels[sel], ce_chunk)
    return F.cross_entropy(model(batch['input_ids'], logits_mask=sel, **kw).logits.float(), labels[sel])


@pytest.mark.parametrize('ce_chunk', [0, 5])
def test_mlm_makes_no_host_sync_and_is_bit_identical(ce_chunk):
    "Before: 3 host syncs a micro-batch (the boolean gather of the hidden states and the labels, its scatter in backward)."
    batch = _mlm_batch()
    assert batch['masked_positions'].dtype == torch.long
    assert torch.equal(batch['masked_positions'], (batch['labels'].flatten() != IGNORE).nonzero().flatten())
    model = build_model('tiny', vocab_size=50)
    def run(loss_fn):
        model.zero_grad(set_to_none=True)
        loss = loss_fn(); loss.backward()
        return loss.detach(), {k: p.grad.clone() for k, p in model.named_parameters()}
    with HostSyncs() as s:
        loss, grads = run(lambda: lm_loss(model, batch, ce_chunk=ce_chunk)[0])
    with HostSyncs() as old:
        ref_loss, ref_grads = run(lambda: _boolean_loss(model, batch, ce_chunk))
    assert s.count == 0, dict(s.ops)
    assert old.count == 3, dict(old.ops)                                    # what it was
    assert torch.equal(loss, ref_loss) and all(torch.equal(grads[k], ref_grads[k]) for k in grads)


def test_a_hand_made_mlm_batch_still_works_with_one_sync():
    batch = {k: v for k, v in _mlm_batch().items() if k != 'masked_positions'}
    model = build_model('tiny', vocab_size=50)
    with HostSyncs() as s: loss, n = lm_loss(model, batch)
    assert s.count == 1 and torch.equal(loss, _boolean_loss(model, batch)) and int(n) == int((batch['labels'] != IGNORE).sum())
