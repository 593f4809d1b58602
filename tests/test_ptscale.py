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


def _setup(tmp_path, **kw):
    "A run set up (model built, run.json written) but not trained; its claim released."
    run, state = P.setup(pretrain_config(**{**TINY, 'out_dir': str(tmp_path), 'run_id': 'r', **kw}))
    run.release()
    return run


def test_run_json_records_each_phases_own_flops_per_token(tmp_path):
    run = _setup(tmp_path, schedule='biphasic', clm_steps=3, total_steps=8, mask_ratio=0.3)
    record = read_json(run.folder/'run.json')
    cfg = run.raw_model.config
    clm, mlm = flops_per_token(cfg, 32, 'clm'), flops_per_token(cfg, 32, 'mlm', 0.3, sparse_head=True)
    assert mlm < clm                                             # the sparse head: the LM head at 30% of the positions
    assert [(p['objective'], p['steps'], p['flops_per_token']) for p in record['phases']] == [('clm', 3, clm), ('mlm', 5, mlm)]
    assert record['flops_per_token'] == pytest.approx((3 * clm + 5 * mlm) / 8)
    dense = read_json(_setup(tmp_path/'dense', schedule='mlm', total_steps=4, sparse_head=False).folder/'run.json')
    assert dense['phases'][0]['flops_per_token'] == dense['flops_per_token'] == clm   # no sparse head: CLM's cost


def test_one_process_fsdp_is_said_aloud(tmp_path, capsys):
    with pytest.warns(RuntimeWarning, match='fsdp=True but this session runs one process: nothing is sharded'):
        _setup(tmp_path, schedule='clm', total_steps=4, fsdp=True)
    assert 'WARNING: fsdp=True' in capsys.readouterr().err
    with warnings.catch_warnings():
        warnings.simplefilter('error', RuntimeWarning)
        _setup(tmp_path/'plain', schedule='clm', total_steps=4)   # nothing to say


def test_an_estimate_above_the_cards_memory_is_said_aloud_with_the_numbers(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(P, '_device_memory', lambda device: 2**20)   # a card of 1 MiB
    with pytest.warns(RuntimeWarning, match=r'estimated peak 0\.\d GiB per process \(\w+, none over 1, .*more than the '
                                            r'0\.000977 GiB of cpu: the run will likely run out of memory'):
        _setup(tmp_path, schedule='clm', total_steps=4)
    assert 'set ce_chunk or gradient_checkpointing=True' in capsys.readouterr().err
    monkeypatch.setattr(P, '_device_memory', lambda device: 80 * 2**30)
    with warnings.catch_warnings():
        warnings.simplefilter('error', RuntimeWarning)
        _setup(tmp_path/'fits', schedule='clm', total_steps=4)
