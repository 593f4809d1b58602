"""The throughput benchmark (`mlmclm.bench.throughput`): its chunked loss trains like the plain one, its sides report
what dynamo did, and its module, the command of earlier versions, names the command that replaced it."""
import subprocess
import sys

import pytest
import torch

from mlmclm.base.files import project_root
from mlmclm.bench.throughput import bench_config, bench_loss, make_batches
from mlmclm.model.transformer import build_model


# Issue 36 item 4, the benchmark split: `python -m mlmclm.bench.throughput`, the command of earlier versions, fails
# with a message naming the new one instead of exiting silently.
def test_the_old_module_command_names_the_new_one():
    run = subprocess.run([sys.executable, '-m', 'mlmclm.bench.throughput', '--size', 'tiny'], capture_output=True, text=True,
                         cwd=project_root(), timeout=300)
    assert run.returncode == 1 and run.stdout == ''
    assert run.stderr.strip() == 'python -m mlmclm.bench.throughput: the command line is `mlmclm bench` (or `python -m mlmclm.bench.smoke`)'


def test_chunked_loss_trains_like_the_plain_loss():
    "Three AdamW steps with the chunked cross-entropy leave the same weights as with the trainer's loss."
    cfg = bench_config('tiny')
    batches = make_batches(cfg, 'mlm', batch_size=2, seq_len=48, n=3)
    weights = []
    for chunk in (0, 20):
        torch.manual_seed(0); model = build_model(cfg)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        for b in batches:
            bench_loss(model, b, sparse_head=True, ce_chunk=chunk).backward(); opt.step(); opt.zero_grad()
        weights.append(model.state_dict())
    assert max((weights[0][k] - weights[1][k]).abs().max().item() for k in weights[0]) < 1e-5


@pytest.mark.usefixtures('one_thread')   # tiny models: one thread is faster (conftest.py)
def test_sides_report_what_dynamo_did_and_an_eager_fallback():
    "Past dynamo's recompile limit blocks run eager without an error: a side counts the hits, and they are reported."
    import torch._dynamo
    from mlmclm.bench.throughput import Side, time_sides
    bs = make_batches(bench_config('tiny'), 'clm', 2, 32, n=2)
    no_docs = [{**b, 'document_ids': None} for b in bs]
    limit = torch._dynamo.config.recompile_limit
    torch._dynamo.reset(); torch._dynamo.config.recompile_limit = 1
    try:
        sides = [Side('plain', build_model('tiny'), bench_loss, no_docs, 'cpu', compile='eager'),
                 Side('docs', build_model('tiny'), bench_loss, bs, 'cpu', compile='eager')]   # a second graph: over the limit
        t = time_sides(sides, steps=1, reps=1, warmup=1)
    finally: torch._dynamo.config.recompile_limit = limit; torch._dynamo.reset()
    assert t['plain']['dynamo']['compiled_frames'] == 1 and t['plain']['dynamo']['recompile_limit_hits'] == 0
    assert t['docs']['dynamo']['recompile_limit_hits'] > 0
