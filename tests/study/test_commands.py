"""The study's commands (`mlmclm.study.commands`): planner counts from the command line, `study status` of a plan with a
control, the Slurm command of several nodes, and the plan's fine-tuning priced at a measured speed only for the model
size it was measured on."""
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mlmclm.base.configs import ConfigError
from mlmclm.base.files import atomic_write_json, project_root, read_json, read_jsonl
from mlmclm.protocol.runs import finetune_config
from mlmclm.study.launchers import finetune_params
from mlmclm.study.plan import PRESETS, finetune_jobs, get_plan, paper_plan, protocol_ablation_plan, select
from mlmclm.study.commands import describe, main
from mlmclm.protocol.paper import PAPER_LRS, PAPER_SEEDS, PAPER_TASKS
from mlmclm import study, study_cli
from mlmclm.study.plan import demo_plan

ROOT = project_root()


def test_plan_command_prints_the_papers_counts():
    out = subprocess.run([sys.executable, '-m', 'mlmclm.study.commands', 'plan', '--preset', 'paper'],
                         capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr
    text = out.stdout
    for label, n in [('pretraining runs', '38'), ('final models', '38'), ('evaluated checkpoints', '50'),
                     ('fine-tuning runs', '18,000')]:
        assert any(line.split() and label in line and n in line for line in text.splitlines()), (label, text)
    assert 'GPU-hours' in text and '110,000' in text
    assert '--preset paper-15120' in text and '15,120' in text      # how to get the cheaper grid


def test_the_cheaper_grid_is_a_preset():
    text = describe(get_plan('paper-15120'))
    assert any('fine-tuning runs' in line and '15,120' in line for line in text.splitlines()), text
    every = {e.name: e.datasets for e in get_plan('paper').evals}
    cheap = {e.name: e.datasets for e in get_plan('paper-15120').evals}
    assert every.keys() == cheap.keys()
    assert {len(every[n]) for n in every} == {12}
    assert {len(cheap[n]) for n in cheap if n.rsplit('-', 1)[-1].isdigit()} == {4}   # intermediate: one per family


@pytest.mark.parametrize('preset, n', [('paper', 18000), ('paper-15120', 15120), ('protocol-ablation', 4320),
                                       ('precision-ablation', 480)])
def test_slurm_jobs_cover_every_finetuning_run_once(preset, n):
    plan = PRESETS[preset]()
    rows = [(e.name, d, run.lr, run.seed) for e, run in finetune_jobs(plan) for d in run.datasets]
    assert len(rows) == len(set(rows)) == n == len({k for _, run in finetune_jobs(plan) for k in run.keys})
    assert set(rows) == set(plan.finetune_runs())


def test_protocol_ablation_plan_without_running_it(tmp_path):
    plan = get_plan('protocol-ablation')
    cells = [(a, p) for a in ('bidirectional', 'causal') for p in ('mean', 'last', 'first')]
    assert plan.runs == {} and plan.counts()['finetuning_runs'] == 2 * 6 * len(PAPER_TASKS) * len(PAPER_LRS) * len(PAPER_SEEDS)
    grid = {(e.source, dict(e.protocol)['attention'], dict(e.protocol)['pooling']) for e in plan.evals}
    assert grid == {(src, a, p) for src in ('MLMvsCLM/610m-clm-42k', 'MLMvsCLM/610m-mlm40-42k') for a, p in cells}
    assert all(e.datasets == PAPER_TASKS for e in plan.evals)
    # what the fine-tuning notebook receives for each point: the released model, its name, and the cell
    for e in plan.evals:
        p = finetune_params(plan, e, tmp_path)
        assert (p['checkpoint'], p['checkpoint_name']) == (e.source, e.source.split('/')[1])
        assert (p['attention'], p['pooling']) == (dict(e.protocol)['attention'], dict(e.protocol)['pooling'])
        assert (p['lrs'], p['seeds'], p['tasks']) == (','.join(map(str, PAPER_LRS)), '0,1,2,3,4', ','.join(PAPER_TASKS))
        cfg = finetune_config(**p)
        assert cfg.max_steps is None and cfg.max_eval_examples is None   # the paper's protocol (train_steps), not the demo's
    small = protocol_ablation_plan(('MLMvsCLM/610m-clm-42k',), datasets=('sst2', 'nq'), lrs=(1e-4,), seeds=(0, 1))
    assert small.counts()['finetuning_runs'] == 1 * 6 * 2 * 1 * 2
    assert len(select(plan, pattern='610m-mlm40-42k@causal-*').evals) == 3
    with pytest.raises(ConfigError, match="pooling=\\('max',\\)"):
        protocol_ablation_plan(pooling=('max',))


def test_precision_ablation_plan_without_running_it(tmp_path):
    "The paper's pure bf16 against fp32 master weights, one dataset per family: each point's notebook gets its format."
    plan = get_plan('precision-ablation')
    assert plan.runs == {} and plan.counts()['finetuning_runs'] == 2 * 2 * 4 * len(PAPER_LRS) * len(PAPER_SEEDS)
    assert {(e.source, e.protocol) for e in plan.evals} == {(src, (('precision', p),)) for p in ('pure_bf16', 'amp_bf16')
                                                           for src in ('MLMvsCLM/610m-clm-42k', 'MLMvsCLM/610m-mlm40-42k')}
    for e in plan.evals:
        cfg = finetune_config(**finetune_params(plan, e, tmp_path))
        assert (cfg.precision, cfg.attention, cfg.pooling) == (dict(e.protocol)['precision'], 'bidirectional', 'mean')
        assert cfg.max_steps is None and cfg.tasks == ','.join(e.datasets)
    keys = {k for _, run in finetune_jobs(plan) for k in run.keys}
    assert all(k.endswith(('|precision=pure_bf16', '|precision=amp_bf16')) for k in keys)   # never the paper's cell


def test_selection_errors_name_the_bad_value():
    with pytest.raises(ConfigError, match="unknown size '7b'"):
        select(paper_plan(), sizes=['7b'])


# ---------------------------------------------------------------- the price of the demo's fine-tuning
# Issue 36 (item 1's leftover): the planner prices the demo's fine-tuning from what the demo fine-tunes.
def _timings():
    "The demo's recorded fine-tuning stages (minutes, figures/demo/timings.json), on this project's 2-core machine."
    return [e['stages']['fine-tuning'] for e in read_json(project_root()/'figures'/'demo'/'timings.json')['demo']
            if 'fine-tuning' in e.get('stages', {})]


def test_the_demos_fine_tuning_is_priced_near_what_the_demo_takes(tmp_path, one_thread):
    """After `mlmclm bench --finetune` on the demo's tiny model on a CPU, the plan prices the demo's fine-tuning within
    a factor 2 of what the demo takes (before: paper-scale lengths and 1,600 examples a run priced ~3x the work), and
    a speed measured on another model size prices nothing."""
    import statistics
    from mlmclm.bench.finetune_speed import finetune_benchmark, finetune_sides
    recorded = _timings()
    assert recorded, 'figures/demo/timings.json records no fine-tuning stage'
    minutes = statistics.median(recorded)
    r = finetune_benchmark('rt_sentiment', size='tiny', steps=8, warmup=2, reps=3, device='cpu', sides=finetune_sides()[-1:])
    ours = r['sides'][-1]
    # one thread with a core to itself, as each of the demo's two workers had: the fastest run's CPU seconds per step,
    # which the load of other processes on this shared machine inflates far less than wall seconds (5x at load 10)
    ours['examples_per_s'] = r['batch_size'] / ours['cpu_step_s_min']
    atomic_write_json(tmp_path/'finetune-rt_sentiment-tiny.json', r)
    demo = demo_plan()
    price = study_cli.measured_finetune_price(demo, folder=tmp_path)
    assert (price['sizes'], price['others']) == (['tiny'], [])
    assert minutes / 2 < price['hours'] * 60 < minutes * 2, (price['hours'] * 60, recorded)
    assert '  fine-tuning examples of corpus_excerpt, corpus_names, corpus_speaker, rt_sentiment: as they ship' in \
        study_cli.describe(demo)                                           # the plan says what priced its examples
    assert 'fine-tuning at the measured speed for tiny' in study_cli.measured_finetune_line(demo, folder=tmp_path)
    other = dict(r, model='610m', body_params=study.body_params('610m'))   # newer, of another size: not applied
    time.sleep(0.01); atomic_write_json(tmp_path/'finetune-rt_sentiment-610m.json', other)
    price = study_cli.measured_finetune_price(demo, folder=tmp_path)
    assert (price['sizes'], price['others'], price['hours']) == ([], ['tiny'], None)
    assert study_cli.measured_finetune_line(demo, folder=tmp_path).startswith('  fine-tuning at the assumed MFU above for tiny')


# Issue 36 item 1: a measured fine-tuning speed prices only the model size it was measured on, and the plan says
# which figure priced what.
SMOLLM2_BODY = 106_203_456   # SmolLM2-135M: 30 blocks of d=576, 1536-wide MLP, 9 heads / 3 KV heads, and the final norm


def _bench(folder: Path, model: str, body_params: int, examples_per_s: float = 8.0):
    atomic_write_json(folder/f'finetune-rt_sentiment-{Path(model).name}.json', dict(
        device='cpu (1 threads)', model=model, steps=1, batch_size=32, body_params=body_params,
        sides=[dict(side='ours packed', examples_per_s=examples_per_s, real_tokens=800)]))


def test_a_speed_measured_on_smollm2_does_not_price_the_demos_tiny_models(tmp_path):
    _bench(tmp_path, 'runs/smollm2/SmolLM2-135M', SMOLLM2_BODY)
    line = study_cli.measured_finetune_line(study.demo_plan(), folder=tmp_path)
    assert line.startswith('  fine-tuning at the assumed MFU above for tiny: the benchmark measured another model size '
                           '(8.0 examples/s of SmolLM2-135M (106,203,456 body parameters)'), line
    assert 'hours' not in line and 'minutes' not in line and '--size tiny' in line


def test_a_speed_measured_on_the_plans_size_prices_it_and_the_line_says_so(tmp_path):
    _bench(tmp_path, 'tiny', study.body_params('tiny'))
    demo = study.demo_plan()
    hours = study.finetune_flops(demo) / (6 * study.body_params('tiny') * 25 * 8.0) / 3600
    line = study_cli.measured_finetune_line(demo, folder=tmp_path)
    assert line.startswith(f'  fine-tuning at the measured speed for tiny: {hours:,.0f} hours on cpu (1 threads) '
                           '(8.0 examples/s of tiny (787,584 body parameters), ours packed;'), line
    assert 'assumed MFU' in study_cli.measured_finetune_line(study.paper_plan(), folder=tmp_path)   # tiny prices no paper size


# Issue 27 item 19.
def test_study_status_of_a_plan_with_a_control_counts_it(tmp_path, capsys):
    "`python -m mlmclm.study.commands status --preset demo` failed with KeyError: None (the control has no pretraining run)."
    from mlmclm.study.commands import main
    main(['status', '--preset', 'demo', '--root', str(tmp_path)])
    lines = [l.split() for l in capsys.readouterr().out.splitlines()]
    assert ['control', 'finetune', '0', '0', '0', '12'] in lines     # 4 tasks x 1 LR x 3 seeds of tiny-random


# --------------------------------------------------------------- pretraining on Slurm: several nodes, a named partition
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
