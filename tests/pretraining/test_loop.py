"""Pretraining end to end: processes, papermill, the paper's configs, and what a single-node Slurm cannot show of
pretraining on Slurm (the sbatch file and command line of several nodes); the rest runs on a real Slurm in
tests/study/test_launchers_slurm.py."""
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from mlmclm.base.configs import ConfigError, build_config
from mlmclm.base.files import project_root, read_jsonl
from mlmclm.model.checkpoints import load
from mlmclm.pretraining.loop import pretrain
from mlmclm.pretraining.checks import check_pretrain_config
from mlmclm.protocol.runs import PretrainConfig, grad_accum, paper_preset, pretrain_config
from mlmclm.study.launchers import pretrain_job_specs
from mlmclm.study.plan import demo_plan, paper_plan
from mlmclm.study.commands import main
from mlmclm.protocol.paper import paper_run_names

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
        assert values == paper_preset(name), name


def test_a_start_checkpoint_with_a_nan_weight_is_refused_naming_it(tmp_path):
    """A start checkpoint with one NaN weight is refused before training, naming the tensor (the non-finite loss of a
    run that diverges is tested in test_pretrain_attack3's n18/n19 cases)."""
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


# ---------------------------------------------------------------- pretraining on Slurm
def test_the_sbatch_files_say_nodes_gpus_time_partition_requeue_and_the_signal(tmp_path):
    from submitit.slurm.slurm import _make_sbatch_string
    spec = pretrain_job_specs(paper_plan(), tmp_path, nodes=4, gpus_per_node=8, timeout_min=2880, partition='gpu')[0]
    text = _make_sbatch_string(command='python -u -m submitit.core._submit /x', folder=tmp_path, **spec['slurm'])
    for line in ('--nodes=4', '--gpus-per-node=8', '--ntasks-per-node=8', '--time=2880', '--partition=gpu',
                 '--requeue', '--signal=USR2@180', f"--job-name=pretrain-{spec['run']}"):
        assert f'#SBATCH {line}\n' in text, line
    cfg = pretrain_config(**spec['params'])
    assert (cfg.global_batch, grad_accum(cfg.global_batch, cfg.batch_size, 32), cfg.run_id) == (2304, 6, spec['run'])
    assert cfg.out_dir == str(tmp_path) and cfg.data_subset == 'sample-350BT'


class _FakeSlurm:
    "Stands in for `submitit.SlurmExecutor` where one node cannot: records each submission's parameters."
    submitted = []
    def __init__(self, folder): self.parameters = {}
    def update_parameters(self, **kw): self.parameters.update(kw)
    def submit(self, job):
        self.submitted.append((job.params['run_id'], dict(self.parameters)))
        return type('Job', (), {'job_id': str(100 + len(self.submitted))})()


def test_the_slurm_command_gives_every_pretraining_job_its_nodes_gpus_time_and_partition(tmp_path, monkeypatch, capsys):
    "Two nodes and a named partition: what the single-node cluster of tests/study/test_launchers_slurm.py cannot run."
    import submitit
    monkeypatch.setattr(submitit, 'SlurmExecutor', _FakeSlurm)
    main(['slurm', '--what', 'pretrain', '--preset', 'demo', '--root', str(tmp_path), '--folder', str(tmp_path/'slurm'),
          '--nodes', '2', '--gpus-per-node', '4', '--time', '90', '--partition', 'gpu', '--cpus-per-task', '6'])
    assert f'submitted {len(demo_plan().runs)} pretraining jobs' in capsys.readouterr().out
    for run, params in _FakeSlurm.submitted:
        assert (params['nodes'], params['ntasks_per_node'], params['cpus_per_task'], params['time'],
                params['partition']) == (2, 4, 6, 90, 'gpu')


def test_every_paper_preset_fits_an_80_gb_card_with_margin():
    "Issue 25 item 7: the measured memory estimate of each released model's run, on the paper's 8 GPUs, as its preset sets it."
    from mlmclm.model.sizes import memory_estimate
    from mlmclm.protocol.runs import paper_preset
    from mlmclm.protocol.schedules import parse_schedule
    for name in paper_run_names(appendix=True):
        cfg = pretrain_config(name)
        accum = grad_accum(cfg.global_batch, cfg.batch_size, 8)
        for phase in parse_schedule(cfg.schedule, cfg.total_steps, mask_ratio=cfg.mask_ratio):
            e = memory_estimate(cfg.size, 'fsdp2' if cfg.fsdp else 'ddp', 8, cfg.batch_size, cfg.seq_len, phase.objective,
                                phase.mask_ratio or 0.4, cfg.sparse_head, cfg.ce_chunk, cfg.gradient_checkpointing, accum,
                                bf16=True, attn_backend='flash', bucket_view=True)
            assert e['peak_gib'] < 0.85 * 79.1, (name, phase, e['peak_gib'])
    assert not pretrain_config('1b-clm-42k').fsdp and not pretrain_config('610m-clm-42k').fsdp   # none shards (issue 33)
