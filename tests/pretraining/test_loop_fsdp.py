"""FSDP2 over two gloo processes: trains, saves sharded state, resumes in new processes, and matches one process, with
the same numerics (fp32 weights under bf16 autocast); and, in one process, every block compiled under FSDP2 with
activation checkpointing."""
import json
import math
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from mlmclm.base.configs import build_config
from mlmclm.base.files import project_root, read_json, read_jsonl
from mlmclm.model.checkpoints import load
from mlmclm.pretraining.loop import pretrain
from mlmclm.protocol.runs import PretrainConfig

from tiny import TINY_PRETRAIN

ROOT = project_root()
TINY = dict(TINY_PRETRAIN, heldout_rows=0)   # no held-out evaluation
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

# run by torchrun (two processes, FSDP2 over gloo) and by plain python (one process): bf16 autocast on a CPU, as on a GPU;
# every forward notes the dtype of the weights it computes with and of the residual stream it writes
NUMERICS = textwrap.dedent('''
    import json, os, sys
    import torch
    import mlmclm.pretraining.loop as P
    import mlmclm.pretraining.setup as S
    from mlmclm.protocol.runs import pretrain_config
    S.pick_dtype = lambda device: torch.bfloat16
    seen, build = {}, S._build
    def note(name):
        def hook(module, args, out):
            seen.setdefault(name, set()).add(str(module.weight.dtype))
            seen.setdefault(name + ' output', set()).add(str(out.dtype))
        return hook
    def build_noted(*args):
        model = build(*args)
        model.model.embed_tokens.register_forward_hook(note('embedding'))
        model.model.layers[0].input_layernorm.register_forward_hook(note('block norm'))
        model.model.norm.register_forward_hook(note('final norm'))
        model.model.layers[-1].mlp.down_proj.register_forward_hook(note('block linear'))
        return model
    S._build = build_noted
    values = dict(json.loads(sys.argv[1]), run_id=sys.argv[2])
    folder = P.pretrain(pretrain_config(**values))
    rank = os.environ.get('RANK', '0')
    (folder/f'dtypes-{rank}.json').write_text(json.dumps({k: sorted(v) for k, v in seen.items()}))
''')


def _numerics_run(tmp_path, run_id, processes, **kw):
    script = tmp_path/'numerics.py'
    script.write_text(NUMERICS)
    values = dict(TINY, schedule='clm', total_steps=4, global_batch=8, lr=5e-3, checkpoint_steps='', save_every=4,
                  out_dir=str(tmp_path), **kw)
    launch = ([sys.executable, '-m', 'torch.distributed.run', '--standalone', '--nproc_per_node', str(processes)]
              if processes > 1 else [sys.executable])
    out = subprocess.run([*launch, str(script), json.dumps(values), run_id], capture_output=True, text=True, cwd=ROOT,
                         timeout=600, env={**os.environ, 'PYTHONPATH': str(ROOT)})
    assert out.returncode == 0, out.stderr[-4000:]
    folder = tmp_path/run_id
    return folder, [read_json(p) for p in sorted(folder.glob('dtypes-*.json'))], read_jsonl(folder/'metrics.jsonl')


# Issue 33 item 4: one set of numerics for sharded and unsharded runs.
def test_sharded_and_unsharded_runs_compute_alike_in_fp32_weights_under_bf16_autocast(tmp_path):
    "FSDP2 gathers fp32 weights and computes under the same bf16 autocast as one process (or DDP): fp32 embeddings, "
    "norm weights and residual stream in both, and the same losses up to the order of float sums."
    sharded, dtypes, losses = _numerics_run(tmp_path, 'fsdp', 2, fsdp=True)
    one, [alone], one_losses = _numerics_run(tmp_path, 'one', 1)
    assert read_json(sharded/'run.json')['ran_on'] == dict(device='cpu', processes=2, sharding='fsdp2', mixed_precision='bf16')
    assert read_json(one/'run.json')['ran_on']['mixed_precision'] == 'bf16'
    want = {'embedding': ['torch.float32'], 'embedding output': ['torch.float32'], 'block norm': ['torch.float32'],
            'block norm output': ['torch.float32'], 'final norm': ['torch.float32'], 'final norm output': ['torch.float32'],
            'block linear': ['torch.float32'], 'block linear output': ['torch.bfloat16']}   # autocast's matmuls in bf16
    assert dtypes == [want, want] and alone == want, (dtypes, alone)
    a, b = [m['loss'] for m in losses], [m['loss'] for m in one_losses]
    assert len(a) == len(b) == 4
    assert abs(a[0] - b[0]) < 1e-6, (a, b)                      # the same weights, rows and kernels: the same loss
    assert max(abs(x - y) for x, y in zip(a, b)) < 5e-4, (a, b)   # then gradients summed in another order
    assert all(w.dtype == torch.float32 for w in load(sharded/'checkpoints'/'step-4').state_dict().values())
