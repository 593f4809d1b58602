"""FSDP2 over two gloo processes: trains, saves sharded state, resumes in new processes, and matches one process; and,
in one process, every block compiled under FSDP2 with activation checkpointing."""
import math
import subprocess
import sys

import pytest
import torch

from mlmclm.base.configs import build_config
from mlmclm.base.files import project_root, read_json, read_jsonl
from mlmclm.model.checkpoints import load
from mlmclm.pretraining.loop import pretrain
from mlmclm.protocol.runs import PretrainConfig

ROOT = project_root()
COMMON = dict(size='tiny', schedule='biphasic', clm_steps=3, total_steps=6, seq_len=32, global_batch=8, batch_size=4, warmup_steps=1,
              decay_steps=2, save_every=2, log_every=1, progress=False, prefetch=0, lr=5e-4, data='embedded')


def _torchrun(args, tmp_path):
    cmd = [sys.executable, '-m', 'torch.distributed.run', '--standalone', '--nproc_per_node', '2', '-m', 'mlmclm.pretraining.loop',
           'run', *(f'{k}={v}' for k, v in {**COMMON, 'out_dir': tmp_path, 'fsdp': True, **args}.items())]
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert out.returncode == 0, out.stderr[-4000:]
    return out.stdout + out.stderr


def test_two_gloo_processes_under_fsdp_save_resume_and_match_one_process(tmp_path):
    _torchrun(dict(run_id='two', stop_at_step=4), tmp_path)               # state saved at step 4, in shards
    state = tmp_path/'two'/'state'
    assert sorted(p.name for p in state.glob('*.distcp')) == ['__0_0.distcp', '__1_0.distcp']
    assert not (state/'config.json').exists()                               # a state, not a model
    log = _torchrun(dict(run_id='two'), tmp_path)                          # new processes resume it
    assert 'at step 4' in log, log[-2000:]
    record = read_json(tmp_path/'two'/'run.json')
    assert record['ran_on']['sharding'] == 'fsdp2' and record['ran_on']['processes'] == 2
    assert [m['step'] for m in read_jsonl(tmp_path/'two'/'metrics.jsonl')] == list(range(1, 7))
    one = pretrain(build_config(PretrainConfig, {**COMMON, 'out_dir': str(tmp_path), 'run_id': 'one'}))   # 2 micro-batches
    a, b = load(one/'checkpoints'/'step-6').state_dict(), load(tmp_path/'two'/'checkpoints'/'step-6').state_dict()
    diff = max((a[k] - b[k]).abs().max().item() for k in a)
    assert diff < 1e-5, diff        # the same rows and masks; only the order of float sums differs
    switch = load(tmp_path/'two'/'checkpoints'/'step-3').state_dict()      # the switch checkpoint, gathered whole
    assert all(switch[k].shape == a[k].shape for k in a)


@pytest.mark.usefixtures('one_thread')   # tiny models: one thread is faster (conftest.py)
def test_every_block_runs_compiled_under_fsdp2_with_checkpointing():
    "`compile_blocks` before sharding: each block's compiled graph runs in the forward pass and in the recomputation;"
    "compiling the whole model first (as `prepare(torch.compile(model))` did) leaves every block eager."
    from mlmclm.bench.smoke import fsdp2_probe
    blocks = fsdp2_probe('tiny', 'cpu', steps=2, seq_len=32)
    assert blocks['block_graph_calls'] == [2 * blocks['layers']] * 2 and blocks['block_graphs'] == 1
    assert blocks['recompile_limit_hits'] == 0 and all(map(math.isfinite, blocks['losses']))
    assert fsdp2_probe('tiny', 'cpu', steps=1, seq_len=32, whole_model=True)['block_graph_calls'] == [0]
