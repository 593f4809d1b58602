"""Issue 33 items 4, 6, 7 and 10 and issue 34 item 10 (full disk): one set of numerics for sharded and unsharded runs,
each phase's own FLOPs in run.json, one-process warnings, checkpoints hashed per rank and linked instead of written twice,
a run that saves nothing, and a full disk during a state save named as such."""
import errno
import json
import os
import shutil
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest
import torch

import mlmclm.pretrain as P
from mlmclm.core import project_root, read_json, read_jsonl
from mlmclm.model import load
from mlmclm.runs import pretrain_config
from mlmclm.sizes import flops_per_token

ROOT = project_root()
TINY = dict(size='tiny', seq_len=32, batch_size=4, warmup_steps=1, decay_steps=1, data='embedded', progress=False,
            prefetch=0, log_every=1, heldout_rows=0)

# run by torchrun (two processes, FSDP2 over gloo) and by plain python (one process): bf16 autocast on a CPU, as on a GPU;
# every forward notes the dtype of the weights it computes with and of the residual stream it writes
NUMERICS = textwrap.dedent('''
    import json, os, sys
    import torch
    import mlmclm.pretrain as P
    from mlmclm.runs import pretrain_config
    P.pick_dtype = lambda device: torch.bfloat16
    seen, build = {}, P._build
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
    P._build = build_noted
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
