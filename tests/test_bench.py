"""The benchmark's command line: ours vs Hugging Face in one run, last line `ratio=...`."""
import json
import subprocess
import sys

from mlmclm.core import project_root


def test_bench_cli_prints_ratio_and_writes_results(tmp_path):
    out = subprocess.run([sys.executable, '-m', 'mlmclm.bench', '--size', 'tiny', '--objective', 'mlm',
                          '--batch-size', '4', '--seq-len', '64', '--steps', '2', '--reps', '1'],
                         capture_output=True, text=True, cwd=project_root(), timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    last = out.stdout.strip().splitlines()[-1]
    assert last.startswith('ratio=') and float(last.split('=')[1]) > 0
    row = json.loads((project_root()/'runs'/'bench'/'tiny-mlm-hf.json').read_text())
    assert row['ours_tokens_per_s'] > 0 and row['baseline_tokens_per_s'] > 0 and row['pipeline_tokens_per_s'] > 0
