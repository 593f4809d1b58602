"""Issue 36 item 4, the benchmark split: `mlmclm bench` runs from `mlmclm.bench.smoke`; `python -m mlmclm.bench.throughput`, the
command of earlier versions, fails with a message naming it instead of exiting silently."""
import subprocess
import sys

from mlmclm.cli import COMMANDS
from mlmclm.base.files import project_root


def test_the_old_module_command_names_the_new_one():
    run = subprocess.run([sys.executable, '-m', 'mlmclm.bench.throughput', '--size', 'tiny'], capture_output=True, text=True,
                         cwd=project_root(), timeout=300)
    assert run.returncode == 1 and run.stdout == ''
    assert run.stderr.strip() == 'python -m mlmclm.bench.throughput: the command line is `mlmclm bench` (or `python -m mlmclm.bench.smoke`)'


def test_the_bench_command_dispatches_to_the_room_above_the_three_it_runs():
    import mlmclm.bench.smoke as run
    from mlmclm import bench, bench_finetune
    assert COMMANDS['bench'][0] == 'mlmclm.bench.smoke'
    assert (run.benchmark, run.finetune_benchmark) == (bench.benchmark, bench_finetune.finetune_benchmark)
    assert run._parser().prog == 'mlmclm bench'
