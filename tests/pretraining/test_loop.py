"""Pretraining end to end (`mlmclm.pretraining.loop`): two processes train what one does, a short run through
papermill needs only `total_steps`, and a start checkpoint with a NaN weight is refused before the run folder exists.
Pretraining on Slurm is tested with the launchers (tests/study/test_launchers.py, test_launchers_slurm.py)."""
import json
import subprocess
import sys
from pathlib import Path

import torch

from mlmclm.base.files import project_root, read_jsonl
from mlmclm.model.checkpoints import load
from mlmclm.pretraining.loop import pretrain

ROOT = project_root()
PY = sys.executable
SMALL = ['size=tiny', 'seq_len=32', 'batch_size=4', 'warmup_steps=1', 'decay_steps=2', 'progress=False']


def _run(args, **kw):
    return subprocess.run([PY, '-m', 'mlmclm.pretraining.loop', 'run', *args], capture_output=True, text=True,
                          cwd=ROOT, timeout=300, **kw)


def _weights(folder):
    return load(folder).state_dict()


def _max_diff(a, b):
    return max((a[k] - b[k]).abs().max().item() for k in a)


def test_two_gloo_processes_equal_one_process_with_twice_the_accumulation(tmp_path):
    "One config (8 rows per step, micro-batches of 4) trains the same batch on one process and on two."
    common = SMALL + ['schedule=biphasic', 'clm_steps=3', 'total_steps=6', 'global_batch=8', f'out_dir={tmp_path}']
    two = subprocess.run([PY, '-m', 'torch.distributed.run', '--nproc_per_node', '2', '-m', 'mlmclm.pretraining.loop', 'run',
                          *common, 'run_id=two'], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert two.returncode == 0, two.stderr[-3000:]
    one = _run(common + ['run_id=one'])
    assert one.returncode == 0, one.stderr[-3000:]
    batch = {n: json.loads((tmp_path/n/'run.json').read_text())['batch'] for n in ('one', 'two')}
    assert batch == dict(one=dict(global_batch=8, micro_batch=4, grad_accum=2, processes=1),
                         two=dict(global_batch=8, micro_batch=4, grad_accum=1, processes=2))
    diff = _max_diff(_weights(tmp_path/'one'/'checkpoints'/'step-6'), _weights(tmp_path/'two'/'checkpoints'/'step-6'))
    assert diff < 1e-5, diff        # same rows, same masks; only the order of float sums differs


def test_a_short_run_needs_only_total_steps_and_runs_quietly(tmp_path, capfd, caplog):
    """Issue 14: `-p total_steps 4` alone trains (warmup, decay, checkpoints, saves derived); no kernel log in the
    terminal, and no papermill warning for a parameter the config knows but the parameters cell does not list."""
    from mlmclm.study.launchers import run_notebook
    out = run_notebook('02_pretrain.ipynb', dict(total_steps=4, seq_len=32, batch_size=4, log_every=1,
                       out_dir=str(tmp_path), run_id='short'), tmp_path/'short.ipynb')
    assert [m['step'] for m in read_jsonl(tmp_path/'short'/'metrics.jsonl')] == [1, 2, 3, 4]
    assert sorted(p.name for p in (tmp_path/'short'/'checkpoints').iterdir()) == ['step-1', 'step-2', 'step-4']
    settings = json.loads((tmp_path/'short'/'run.json').read_text())
    assert json.dumps(settings).count('"warmup_steps": 0') >= 1, settings
    nb = json.loads(out.read_text())
    assert any('image/png' in o.get('data', {}) for c in nb['cells'] for o in c.get('outputs', [])), 'no loss figure'
    captured = capfd.readouterr()
    assert 'without encryption' not in captured.err + captured.out
    assert not [r for r in caplog.records if r.levelno >= 30], [r.getMessage() for r in caplog.records]


def test_a_start_checkpoint_with_a_nan_weight_is_refused_naming_it(tmp_path):
    """A start checkpoint with one NaN weight is refused before training, naming the tensor (the non-finite loss of a
    run that diverges is tested in test_loop_faults.py's n18 cases, the checks' n19 case in test_checks.py)."""
    from mlmclm.model.transformer import build_model
    from mlmclm.model.checkpoints import save
    model = build_model('tiny', vocab_size=256)
    with torch.no_grad(): model.model.layers[0].mlp.up_proj.weight[0, 0] = float('nan')
    save(model, tmp_path/'nan-ckpt')
    res = _run(SMALL + ['schedule=clm', 'total_steps=4', f'init_from={tmp_path/"nan-ckpt"}', 'tokenizer=embedded',
                        f'out_dir={tmp_path}', 'run_id=nan', 'save_every=1'])
    assert res.returncode != 0
    assert 'not finite' in res.stderr and 'model.layers.0.mlp.up_proj.weight' in res.stderr, res.stderr[-2000:]
    assert 'Traceback' not in res.stderr and not (tmp_path/'nan').exists()   # refused before the run folder is made
