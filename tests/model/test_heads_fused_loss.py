"""Issue 48 item 3: the LM head and its loss compiled as one graph or fused (`mlmclm.model.heads.lm_head_loss`) give the
plain loss and its gradients (fp32 to rounding, bf16 within its rounding), train like it, and keep less memory."""
import pytest
import torch
import torch.nn.functional as F

from mlmclm.base.configs import ConfigError
from mlmclm.base.devices import MemoryMeter
from mlmclm.bench.throughput import bench_config, make_batches
from mlmclm.model.heads import HEAD_LOSSES, IGNORE, fused_linear_cross_entropy, lm_head_loss
from mlmclm.model.transformer import build_model
from mlmclm.pretraining.objectives import lm_loss

pytestmark = pytest.mark.usefixtures('one_thread')
CPU_COMPILE = dict(backend='aot_eager_decomp_partition')   # inductor's decompositions and partitioner, no code generation
BF16_EPS = 2 ** -7


def _inputs(n=75, V=300, hidden=24, lead=(), seed=0):
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(*lead, n, hidden, generator=g).requires_grad_()
    w = (torch.randn(V, hidden, generator=g) * 0.05).requires_grad_()
    y = torch.randint(0, V, (*lead, n), generator=g); y[..., ::4] = IGNORE
    return h, w, y


def _run(how, bf16, inputs, **kw):
    h, w, y = (t.detach().clone().requires_grad_(t.requires_grad) for t in inputs)
    with torch.autocast('cpu', dtype=torch.bfloat16, enabled=bf16): loss = lm_head_loss(h, w, y, how, **kw)
    loss.backward()
    return loss.detach(), h.grad, w.grad


def _error(a, b): return max(((x - y).abs().max() / y.abs().max()).item() for x, y in zip(a, b))


@pytest.mark.parametrize('bf16', [False, True])
@pytest.mark.parametrize('how, kw', [('fused', dict(chunk=16)), ('fused', dict(chunk=1000)), ('compiled', CPU_COMPILE),
                                     ('plain', dict(chunk=16))])
def test_equal_to_the_plain_loss(how, kw, bf16):
    "Batched hidden states, a chunk that does not divide the positions, a quarter of them unlabelled."
    inputs = _inputs(lead=(3,))
    plain = _run('plain', bf16, inputs)
    err = _error(_run(how, bf16, inputs, **kw), plain)
    assert err < (2 * BF16_EPS if bf16 else 1e-5), err
    mine = _run(how, bf16, inputs, **kw)
    assert mine[1].dtype == mine[2].dtype == torch.float32   # gradients in the dtype of what they are the gradients of


def test_a_chunk_without_labels_and_no_label_at_all():
    h, w, y = _inputs(n=40)
    y[:20] = IGNORE                                            # the whole first chunk unlabelled
    torch.testing.assert_close(fused_linear_cross_entropy(h, w, y, chunk=20), F.cross_entropy(h @ w.T, y, ignore_index=IGNORE))
    none = fused_linear_cross_entropy(h, w, torch.full_like(y, IGNORE), chunk=20)
    none.backward()
    assert none.item() == 0 and h.grad.abs().sum() == 0 and w.grad.abs().sum() == 0


def test_gradients_add_to_what_is_there():
    "As autograd accumulates: a second backward adds, the head's gradient from another use (tied weights) is kept."
    h, w, y = _inputs()
    (lm_head_loss(h, w, y, 'fused', 16) * 2).backward()
    once = w.grad.clone()
    lm_head_loss(h, w, y, 'fused', 16).backward()
    torch.testing.assert_close(w.grad, once * 1.5)


def test_training_with_each_head_loss_moves_the_weights_alike(monkeypatch):
    """Four SGD steps of the tiny model through `lm_loss`, CLM dense and MLM sparse, with each head loss: the weights
    move alike to float rounding (one step's gradients agree to about 1e-6; SGD, since AdamW's normalisation would
    magnify rounding in gradients near zero)."""
    from mlmclm.model import heads
    real = heads.compiled_head_loss
    monkeypatch.setattr(heads, 'compiled_head_loss', lambda backend='inductor': real(CPU_COMPILE['backend']))  # no C++ build
    cfg, moved = bench_config('tiny'), {}
    for how in HEAD_LOSSES:
        torch.manual_seed(0); model = build_model(cfg)
        start = {k: v.clone() for k, v in model.state_dict().items()}
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for objective in ('clm', 'mlm'):
            for b in make_batches(cfg, objective, batch_size=2, seq_len=32, n=2):
                lm_loss(model, b, head_loss=how)[0].backward(); opt.step(); opt.zero_grad()
        moved[how] = {k: v - start[k] for k, v in model.state_dict().items()}
    largest = max(d.abs().max().item() for d in moved['plain'].values())
    for how in ('compiled', 'fused'):
        assert max((moved[how][k] - d).abs().max().item() for k, d in moved['plain'].items()) < 1e-4 * largest, how


def _peak_and_saved(how, **kw):
    h, w, y = _inputs(n=1024, V=8000, hidden=32)
    saved, own = {}, {h.untyped_storage().data_ptr(), w.untyped_storage().data_ptr()}
    def keep(t):
        if t.untyped_storage().data_ptr() not in own: saved[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t
    with torch.autograd.graph.saved_tensors_hooks(keep, lambda t: t), torch.autocast('cpu', dtype=torch.bfloat16):
        loss = lm_head_loss(h, w, y, how, **kw)
    loss.backward()
    with MemoryMeter() as mm, torch.autocast('cpu', dtype=torch.bfloat16): lm_head_loss(h, w, y, how, **kw).backward()
    return mm.peak, sum(saved.values())


def test_memory_on_a_cpu():
    "bf16 autocast, 1,024 positions of 8,000 words (32 MiB of fp32 logits): what each peaks at and keeps for backward."
    logits = 1024 * 8000 * 4
    plain, fused, compiled = _peak_and_saved('plain'), _peak_and_saved('fused', chunk=128), _peak_and_saved('compiled', **CPU_COMPILE)
    assert plain[0] > 2.5 * logits and plain[1] >= logits          # fp32 log-probabilities kept for backward
    assert fused[0] < 0.4 * logits and fused[1] < 0.1 * logits     # a chunk's logits at a time; the gradients kept
    assert compiled[1] < 0.6 * plain[1]                             # the bf16 logits kept, not fp32 log-probabilities


def test_bad_choices_are_named():
    h, w, y = _inputs()
    with pytest.raises(ConfigError, match=r"head loss 'liger'; choose one of \['plain', 'compiled', 'fused'\]"):
        lm_head_loss(h, w, y, 'liger')
    with pytest.raises(ConfigError, match='chunk=0 must be >= 1'):
        fused_linear_cross_entropy(h, w, y, chunk=0)
