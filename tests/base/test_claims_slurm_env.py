"""Issue 49, N21: a `SLURM_RESTART_COUNT` that is no whole number (`abc`, `1.0`) stopped every command that claims work
(`pretrain`, the sweeps, `results compact`) with a bare `ValueError: invalid literal for int()`, naming no variable.
It now counts as 0, warned of with the variable and its value."""
import json
import subprocess
import sys

import pytest

from mlmclm.base.claims import slurm_job, try_claim
from mlmclm.base.files import project_root
from mlmclm.results.store import StoreWriter

ROOT = project_root()


@pytest.mark.parametrize('value', ['abc', '1.0', ' '])
def test_n21_an_unreadable_restart_count_counts_as_0_and_is_named(tmp_path, monkeypatch, value):
    monkeypatch.setenv('SLURM_JOB_ID', '123')
    monkeypatch.setenv('SLURM_RESTART_COUNT', value)
    if value.strip():
        with pytest.warns(RuntimeWarning, match=f"SLURM_RESTART_COUNT={value!r} is not a whole number; counted as 0"):
            held = try_claim(tmp_path/'a.claim')
    else: held = try_claim(tmp_path/'a.claim')                            # blank: unset, no warning needed
    assert json.loads((tmp_path/'a.claim').read_text())['slurm_restart'] == 0
    held.release()
    monkeypatch.setenv('SLURM_RESTART_COUNT', '2')
    assert slurm_job()['slurm_restart'] == 2


def test_n21_results_compact_runs_inside_such_a_job(tmp_path):
    "The attack's command: it used to end in the ValueError."
    rows = [dict(checkpoint_name='A', dataset='sst2', family='SC', lr=1e-4, seed=k, val_score=.5, test_score=.5) for k in range(3)]
    with StoreWriter(tmp_path/'k1.jsonl') as w: w.append(rows)
    env = dict(__import__('os').environ, SLURM_JOB_ID='123', SLURM_RESTART_COUNT='abc')
    res = subprocess.run([sys.executable, '-c', 'import sys; from mlmclm.cli import main; sys.exit(main(sys.argv[1:]))',
                          'results', 'compact', str(tmp_path/'k1.jsonl')], capture_output=True, text=True, cwd=ROOT,
                         env=env, timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "SLURM_RESTART_COUNT='abc' is not a whole number" in res.stderr
