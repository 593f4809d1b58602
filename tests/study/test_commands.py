"""The study: planner counts from the command line, and a launcher that resumes without redoing work."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

from mlmclm.base.configs import ConfigError
from mlmclm.base.files import project_root, read_jsonl
from mlmclm.results.store import read_rows
from mlmclm.protocol.runs import finetune_config
from mlmclm.study.launchers import finetune_params, launch
from mlmclm.study.plan import PRESETS, build_plan, finetune_jobs, get_plan, paper_plan, protocol_ablation_plan, select
from mlmclm.study.commands import describe
from mlmclm.protocol.paper import PAPER_LRS, PAPER_SEEDS, PAPER_TASKS

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


def _tiny_plan():
    return build_plan('unit', {'E1': ['tiny-clm-42k', 'tiny-mlm40-42k']}, ('rt_sentiment',), ('rt_sentiment',),
                      lrs=(1e-3,), seeds=(0,), step_scale=1 / 2000,   # 42k steps -> 21, warmup/decay -> 1
                      pretrain_preset='demo', finetune_preset='demo',
                      pretrain_overrides=dict(seq_len=32, batch_size=4, lr=2e-3, data='embedded', save_every=10, log_every=5),
                      finetune_overrides=dict(max_steps=3, eval_every=3, max_eval_examples=20))


def test_launcher_skips_finished_runs_and_resumes_the_rest(tmp_path):
    plan = _tiny_plan()
    first = select(plan, pattern='tiny-clm-*')              # an "interrupted" study: only one branch got done
    launch(first, tmp_path, progress=False)
    done_nb, = (tmp_path/'notebooks').glob('pretrain-tiny-clm-42k-*.ipynb')      # named after its launcher (host, pid)
    stamp = done_nb.stat().st_mtime_ns
    assert (tmp_path/'tiny-clm-42k'/'done.json').is_file()
    assert not (tmp_path/'tiny-mlm40-42k').exists()
    launch(plan, tmp_path, progress=False)                   # the whole study: the rest runs, nothing is redone
    assert done_nb.stat().st_mtime_ns == stamp
    assert (tmp_path/'tiny-mlm40-42k'/'done.json').is_file()
    rows = read_rows(tmp_path/'results.jsonl')
    assert sorted(r['checkpoint_name'] for r in rows) == ['tiny-clm-42k', 'tiny-mlm40-42k']
    assert rows[0]['pretrain_run_id'] in ('tiny-clm-42k', 'tiny-mlm40-42k')   # pretraining metadata travels


def test_each_finetuning_worker_sees_its_own_gpu(tmp_path, monkeypatch):
    "Issue 25 item 13: one worker per GPU by default, each with its own CUDA_VISIBLE_DEVICES; more workers than GPUs refused."
    import mlmclm.study.launchers as launchers
    seen = []
    monkeypatch.setattr(launchers, '_walk', lambda *a, **k: seen.append(os.environ.get('CUDA_VISIBLE_DEVICES')))
    monkeypatch.setattr(launchers, 'visible_gpus', lambda: ['0', '1'])
    plan, before = _tiny_plan(), os.environ.get('CUDA_VISIBLE_DEVICES')
    launchers._finetune_helper(plan, tmp_path, None, '1')                  # what a spawned worker runs
    launchers._finetune_stage(plan, tmp_path, False, ['0'])                # the launcher itself: the first GPU
    assert seen == ['1', '0'] and os.environ.get('CUDA_VISIBLE_DEVICES') == before   # restored after each
    assert launchers.finetune_workers(None, launchers.visible_gpus()) == ['0', '1']
    with pytest.raises(ConfigError, match='workers=4 but this machine shows 2 GPU'):
        launch(plan, tmp_path, stages=('finetune',), workers=4)
