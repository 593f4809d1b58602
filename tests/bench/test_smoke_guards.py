"""Issue 48 item 2, an honest smoke: CPU guards, with `compile='eager'` and torch's varlen op given a CPU kernel, that
would have caught each finding of the issue: the benchmark's two sides compiling two graphs (RoPE tables `(1, T, d)`
against `(B, T, d)`), the trainer's first compile counted as recompiles after earlier parts, a set-up measurement
leaving graphs and shape history that make the trainer's blocks recompile and go dynamic, and the set-up depending on
the private op at all for a named size."""
import functools
from pathlib import Path

import pytest
import torch

import mlmclm.bench.smoke as smoke
import mlmclm.bench.throughput as throughput
import mlmclm.model.memory as memory
import mlmclm.pretraining.setup as pretrain_setup
from mlmclm.bench.throughput import benchmark, dynamo_counts
from mlmclm.model.sizes import model_config, stored_activation_bytes
from mlmclm.model.transformer import Attention, Block, Rotary, compile_blocks

pytestmark = pytest.mark.usefixtures('one_thread')
CPU = torch.device('cpu')


@pytest.fixture
def gpu_path_on_cpu(monkeypatch):
    "The GPU's attention path on the CPU: torch's varlen op (CPU kernels) as every layer's kernel; dynamo reset around."
    torch._dynamo.reset()
    with memory.gpu_varlen_on_cpu() as kernel:
        monkeypatch.setattr(Attention, 'varlen_impl', staticmethod(kernel))
        yield kernel
    torch._dynamo.reset()


def _flash_benchmark():
    r = benchmark('tiny', 'clm', 'hf', 2, 32, steps=1, reps=1, warmup=2, device='cpu', compile='eager',
                  attn_backend='flash', bf16=True)
    return {s['side']: s for s in r['sides']}


def test_both_benchmark_sides_run_one_graph(gpu_path_on_cpu, monkeypatch):
    sides = _flash_benchmark()
    assert (sides['ours']['compiled_frames'], sides['ours+docs']['compiled_frames']) == (1, 0)   # one block graph
    assert all(s['recompiles'] == s['first_step_recompiles'] == s['graph_breaks'] == 0 for s in sides.values())
    # before: `ours` without document ids got (1, T, d) RoPE tables, `ours+docs` (B, T, d): compiled again
    monkeypatch.setattr(throughput, '_no_documents', lambda batch, flash=False: {**batch, 'document_ids': None})
    sides = _flash_benchmark()
    assert sides['ours+docs']['compiled_frames'] == 1 and sides['ours+docs']['first_step_recompiles'] == 1


@pytest.fixture
def trainer_compiles_eager(monkeypatch):
    "The trainer compiles its blocks as on a GPU, with dynamo's eager backend (no code generation)."
    monkeypatch.setattr(pretrain_setup, 'compile_blocks', functools.partial(compile_blocks, backend='eager'))


def _earlier_part_then_trainer(tmp_path: Path) -> dict:
    "A compiled benchmark of another shape (as the smoke's benchmark part), then the trainer part, in one process."
    smoke._smoke_part('benchmark', lambda: dict(benchmark('tiny', 'mlm', 'hf', 2, 16, steps=1, reps=1, warmup=1, device='cpu',
                                                           documents=False, compile='eager'), ok=True), CPU, None)
    return smoke._smoke_part('pretrain', lambda: smoke._smoke_pretrain(CPU, 'tiny', 2, 32, tmp_path, compiled=True), CPU, None)


def test_the_trainer_meets_no_graph_of_an_earlier_part(tmp_path, trainer_compiles_eager, monkeypatch):
    fresh = _earlier_part_then_trainer(tmp_path/'a')
    assert fresh['ok'] and fresh['checks']['recompiles'] and fresh['dynamo']['recompiles'] == 0, fresh
    assert fresh['checks']['memory'] is None   # compiled on a CPU: not measured (dynamo compiles nothing under MemoryMeter)
    # before: no dynamo reset where a part starts; the trainer's first compile failed the earlier graphs' guards
    monkeypatch.setattr(smoke, '_fresh', lambda dev: None)
    stale = _earlier_part_then_trainer(tmp_path/'b')
    assert stale['dynamo']['recompiles'] > 0, stale['dynamo']   # the first step's compile (the issue: +2 on a GPU)
    assert stale['dynamo']['recompiles_after_first_step'] == 0 and stale['ok']   # counted after the first step: no failure


def _trainer_like_block_graph(cfg) -> dict:
    "Compile a fresh block as the trainer does (`Block.compile`, i.e. `Module._call_impl`) and run it once."
    graphs = []
    def backend(gm, example_inputs):
        graphs.append(any(isinstance(x, torch.SymInt) for x in example_inputs)); return gm.forward
    block = Block(cfg); block.compile(backend=backend)
    docs = torch.tensor([[0] * 4 + [1] * 4] * 3)
    cos, sin = Rotary(cfg)(torch.arange(8)[None])
    from mlmclm.model.transformer import allowed_attention
    before = dynamo_counts()['recompiles']
    block(torch.randn(3, 8, cfg.hidden_size), cos, sin, False, allowed_attention(False, 8, None, docs))
    return dict(graphs=len(graphs), dynamic=any(graphs), recompiles=dynamo_counts()['recompiles'] - before)


def test_a_set_up_measurement_leaves_the_trainers_blocks_alone():
    "Measuring an unknown shape's compiled activations compiles a function of its own, static, with nothing left behind."
    torch._dynamo.reset()
    cfg = model_config('tiny', hidden_size=40, intermediate_size=96, num_attention_heads=5, num_key_value_heads=5,
                       head_dim=8, attn_backend='sdpa')
    memory._activation_bytes.cache_clear()
    assert memory.activation_bytes(cfg, bf16=False, compiled=True) > 0
    try: assert _trainer_like_block_graph(cfg) == dict(graphs=1, dynamic=False, recompiles=0)
    finally: torch._dynamo.reset(); memory._activation_bytes.cache_clear()


def test_a_named_size_needs_no_measurement_and_no_private_op(monkeypatch):
    "The set-up estimate of the 1b trainer (compiled, 'flash', bf16): the stored table, torch's private op untouched."
    def refuse(*a, **k): raise AssertionError('the set-up measured: it needs torch_attn::_varlen_attn')
    monkeypatch.setattr(memory, 'gpu_varlen_on_cpu', refuse)
    monkeypatch.setattr(memory, 'activation_bytes', refuse)
    for size in ('210m', '610m', '1b'):
        cfg = model_config(size, attn_backend='flash')
        assert memory.MEASURED['activation_bytes'](cfg, True, compiled=True) == stored_activation_bytes(cfg, compiled=True)
