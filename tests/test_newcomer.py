"""Issue 39, the newcomer's path: your own runs drawn in their own units, paper-scale figures that say what they lack,
directions judged by size as well as sign, README numbers read from the committed results, and command lines that
answer `--help` and bad settings without a traceback."""
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from mlmclm.core import project_root
from mlmclm.figures import difference_range, direction_verdict, directions
from mlmclm.paper_runs import reported_scores

ROOT = project_root()
SCRIPT = Path(sys.executable).parent/'mlmclm'


def _mlmclm(*args, timeout=120):
    "Run the console script (this tree's code first on the path) and return the finished process."
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    cmd = [str(SCRIPT)] if SCRIPT.is_file() else [sys.executable, '-c', 'import sys; from mlmclm.cli import main; sys.exit(main())']
    return subprocess.run(cmd + list(args), capture_output=True, text=True, cwd=ROOT, env=env, timeout=timeout)


# ---------------------------------------------------------------- item 3: directions by sign and size

def test_a_difference_75_times_the_papers_is_not_as_the_paper():
    assert direction_verdict(-36.06, -38.70, -33.41, -0.48) == 'same sign, 75x larger'
    assert direction_verdict(37.05, 33.09, 41.02, 0.50) == 'same sign, 74x larger'
    assert direction_verdict(-0.9, -1.2, -0.6, -0.48) == 'as the paper'          # 1.9x: within the factor
    assert direction_verdict(4.0, 0.5, 7.5, 0.85) == 'as the paper'              # 4.7x, but the paper's value is inside


def test_directions_keep_intervals_of_a_difference_of_percentages_within_100_points():
    per_seed = pd.DataFrame([dict(checkpoint=ck, family='QA', seed=sd, test_score=v)
                             for ck, vs in (('tiny-clm-42k', (0.05, 0.95, 0.77)), ('tiny-mlm40-42k', (0.0, 0.0, 0.0)))
                             for sd, v in enumerate(vs)])
    row = directions(per_seed, reported_scores(), 'tiny').iloc[0]
    assert row.ci_low == -100.0 and -100 <= row.ci_high <= 100
    assert difference_range(-103.14, 111.11) == (-100.0, 100.0)
    assert np.isnan(difference_range(np.nan, np.nan)[0])


# ---------------------------------------------------------------- item 5: command lines

def test_pretrain_help_exits_0_with_the_usage_on_stdout():
    r = _mlmclm('pretrain', '--help')
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith('usage: python -m mlmclm.pretrain') and 'schedule' in r.stdout


def test_pretrain_without_a_subcommand_still_exits_2_with_the_usage_on_stderr():
    r = _mlmclm('pretrain')
    assert r.returncode == 2 and r.stderr.startswith('usage:') and not r.stdout


def test_pretrain_run_with_a_bad_setting_prints_one_error_line_and_exits_2():
    r = _mlmclm('pretrain', 'run', 'schedule=foo')
    assert r.returncode == 2
    assert 'Traceback' not in r.stderr and r.stderr.startswith("error: schedule='foo'"), r.stderr
    r = _mlmclm('pretrain', 'run', 'total_steps')
    assert r.returncode == 2 and r.stderr.startswith("error: 'total_steps' is not key=value"), r.stderr


def test_bench_help_names_the_smoke_subcommand():
    r = _mlmclm('bench', '--help')
    assert r.returncode == 0 and 'smoke' in r.stdout and 'smoke --help' in r.stdout
