"""The study: planner counts from the command line, and a launcher that resumes without redoing work."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

from mlmclm.core import ConfigError, project_root
from mlmclm.results import read_rows
from mlmclm.study import build_plan, finetune_jobs, launch, paper_plan, select

ROOT = project_root()


def test_plan_command_prints_the_papers_counts():
    out = subprocess.run([sys.executable, '-m', 'mlmclm.study', 'plan', '--preset', 'paper'],
                         capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr
    text = out.stdout
    for label, n in [('pretraining runs', '38'), ('final models', '38'), ('evaluated checkpoints', '50'),
                     ('fine-tuning runs', '15,120')]:
        assert any(line.split() and label in line and n in line for line in text.splitlines()), (label, text)
    assert 'GPU-hours' in text and '110,000' in text


def test_slurm_jobs_cover_every_finetuning_run_once():
    plan = paper_plan()
    rows = [(j['checkpoint'], t, j['lr'], j['seed']) for j in finetune_jobs(plan) for t in j['tasks'].split(',')]
    assert len(rows) == len(set(rows)) == 15120
    assert set(rows) == set(plan.finetune_runs())


def test_selection_errors_name_the_bad_value():
    with pytest.raises(ConfigError, match="unknown size '7b'"):
        select(paper_plan(), sizes=['7b'])


def _tiny_plan():
    return build_plan('unit', {'E1': ['tiny-clm-42k', 'tiny-mlm40-42k']}, ('rt_sentiment',), ('rt_sentiment',),
                      lrs=(1e-3,), seeds=(0,), step_scale=1 / 2000,   # 42k steps -> 21, warmup/decay -> 1
                      pretrain_overrides=dict(seq_len=32, batch_size=4, lr=2e-3, data='embedded', tokenizer=None,
                                              save_every=10, log_every=5),
                      finetune_overrides=dict(max_steps=3, eval_every=3, max_eval_examples=20))


def test_launcher_skips_finished_runs_and_resumes_the_rest(tmp_path):
    plan = _tiny_plan()
    first = select(plan, pattern='tiny-clm-*')              # an "interrupted" study: only one branch got done
    launch(first, tmp_path, progress=False)
    done_nb = tmp_path/'notebooks'/'pretrain-tiny-clm-42k.ipynb'
    stamp = done_nb.stat().st_mtime_ns
    assert (tmp_path/'tiny-clm-42k'/'done.json').is_file()
    assert not (tmp_path/'tiny-mlm40-42k').exists()
    launch(plan, tmp_path, progress=False)                   # the whole study: the rest runs, nothing is redone
    assert done_nb.stat().st_mtime_ns == stamp
    assert (tmp_path/'tiny-mlm40-42k'/'done.json').is_file()
    rows = read_rows(tmp_path/'results.jsonl')
    assert sorted(r['checkpoint_name'] for r in rows) == ['tiny-clm-42k', 'tiny-mlm40-42k']
    assert rows[0]['pretrain_run_id'] in ('tiny-clm-42k', 'tiny-mlm40-42k')   # pretraining metadata travels
