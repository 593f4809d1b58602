"""Pretraining end to end: processes, kills, papermill and the paper's configs."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from mlmclm.core import ConfigError, build_config, project_root, read_jsonl
from mlmclm.model import load
from mlmclm.pretrain import PretrainConfig, check_pretrain_config, paper_config
from mlmclm.vocab import paper_run_names

ROOT = project_root()
PY = sys.executable
SMALL = ['size=tiny', 'seq_len=32', 'batch_size=4', 'warmup_steps=1', 'decay_steps=2', 'progress=False']


def _run(args, **kw):
    return subprocess.run([PY, '-m', 'mlmclm.pretrain', 'run', *args], capture_output=True, text=True,
                          cwd=ROOT, timeout=300, **kw)


def _weights(folder):
    return load(folder).state_dict()


def _max_diff(a, b):
    return max((a[k] - b[k]).abs().max().item() for k in a)


def test_two_gloo_processes_equal_one_process_with_twice_the_accumulation(tmp_path):
    common = SMALL + ['schedule=biphasic', 'clm_steps=3', 'total_steps=6', f'out_dir={tmp_path}']
    two = subprocess.run([PY, '-m', 'torch.distributed.run', '--nproc_per_node', '2', '-m', 'mlmclm.pretrain', 'run',
                          *common, 'run_id=two', 'grad_accum=1'], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert two.returncode == 0, two.stderr[-3000:]
    one = _run(common + ['run_id=one', 'grad_accum=2'])
    assert one.returncode == 0, one.stderr[-3000:]
    run = json.loads((tmp_path/'two'/'run.json').read_text())
    assert run['config']['grad_accum'] == 1
    diff = _max_diff(_weights(tmp_path/'one'/'checkpoints'/'step-6'), _weights(tmp_path/'two'/'checkpoints'/'step-6'))
    assert diff < 1e-5, diff        # same rows, same masks; only the order of float sums differs


def test_papermill_biphasic_line_works_and_rejects_typos(tmp_path):
    pm = Path(PY).with_name('papermill')
    out = subprocess.run([str(pm), 'nbs/02_pretrain.ipynb', str(tmp_path/'out.ipynb'), '-p', 'schedule', 'biphasic',
                          '-p', 'total_steps', '40', '-p', 'warmup_steps', '4', '-p', 'decay_steps', '8', '-p', 'checkpoint_steps', '20', '-p', 'out_dir', str(tmp_path), '-p', 'run_id', 'pm'],
                         capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    objectives = [m['objective'] for m in read_jsonl(tmp_path/'pm'/'metrics.jsonl')]
    assert objectives[0] == 'clm' and objectives[-1] == 'mlm'          # clm_fraction defaults to 0.25
    assert (tmp_path/'pm'/'checkpoints'/'step-10').is_dir() and (tmp_path/'pm'/'checkpoints'/'step-40').is_dir()
    bad = subprocess.run([str(pm), 'nbs/02_pretrain.ipynb', str(tmp_path/'bad.ipynb'), '-p', 'mask_ration', '0.3',
                          '-p', 'out_dir', str(tmp_path)], capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert bad.returncode != 0
    assert "unknown parameter 'mask_ration' (did you mean 'mask_ratio'?)" in bad.stderr + bad.stdout


@pytest.mark.parametrize('values, message', [
    (dict(schedule='bert'), "cannot read phase 'bert'"),
    (dict(mask_ratio=1.5), 'mask_ratio=1.5 is out of range'),
    (dict(schedule='biphasic', clm_steps=500, total_steps=100), 'clm_steps=500 must be in [1, total_steps-1]'),
    (dict(init_from='runs/does-not-exist'), "init_from='runs/does-not-exist' is not a local folder, and the hub is offline"),
    (dict(init_from='./runs/does-not-exist'), "init_from='./runs/does-not-exist' does not exist"),
    (dict(replace_mask=0.8), 'must be 1'),
])
def test_bad_parameters_fail_before_training(values, message, monkeypatch):
    monkeypatch.setenv('HF_HUB_OFFLINE', '1')   # 'runs/does-not-exist' could be a hub id; offline it cannot be
    with pytest.raises(ConfigError) as err:
        check_pretrain_config(build_config(PretrainConfig, values))
    assert message in str(err.value)


def test_committed_paper_configs_match_the_code():
    folder = ROOT/'nbs'/'configs'
    names = paper_run_names(appendix=True)
    assert sorted(p.stem for p in folder.glob('*.yaml')) == sorted(names)
    for name in names:
        text = (folder/f'{name}.yaml').read_text()
        values = {k: json.loads(v) for k, v in (line.split(': ', 1) for line in text.splitlines()[1:])}
        assert values == paper_config(name), name


def test_non_finite_loss_stops_with_a_clear_message(tmp_path):
    res = _run(SMALL + ['schedule=clm', 'total_steps=4', 'lr=1e30', 'warmup_steps=0', 'decay_steps=0',
                        'grad_clip=0', f'out_dir={tmp_path}', 'run_id=nan', 'save_every=1'])
    assert res.returncode != 0
    assert 'non-finite loss' in res.stderr
