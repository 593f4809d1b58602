"""A slice of the demo rerun and compared with its committed numbers by `mlmclm compare` (issue 45, item 4).

The slice: the demo's CLM run (`tiny-clm-42k`, the demo's settings) pretrained up to its intermediate checkpoint
(step 80 of 336, `stop_at_step`), and that checkpoint (`tiny-clm-42k-10000` in the demo's results) fine-tuned on one
task (`corpus_names`, TC) at the demo's LR over the demo's three seeds, with the pins of `.ci/demo` (one thread; on an
AVX2 CPU, the AVX2 code paths of torch, MKL and oneDNN). About a minute on 2 cores.

The reference, `tests/fixtures/demo_slice/` (results.csv, pretrain_loss.csv, provenance.json), was produced by this
file on the machine its provenance.json names:

    .venv/bin/python tests/results/test_compare_slice.py run /tmp/slice    # it sets the pins of `pinned_env` itself
    cp /tmp/slice/slice/* tests/fixtures/demo_slice/

On a machine of the reference's kind (the same CPU model, vector kernels with their pins, and torch version) the rerun
must be bit-identical: any change of the numbers (code, or numerics) fails. On another CPU kind the numbers may move
in their last digits and, through near-chance fine-tuning, more: there the rerun must stay within the spread measured
between two numerics of one machine (`TOLERANCE`, measured on this slice), which a real change of what the demo
computes exceeds."""
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
REFERENCE = ROOT/'tests'/'fixtures'/'demo_slice'
RUN, POINT, TASK, STOP = 'tiny-clm-42k', 'tiny-clm-42k-10000', 'corpus_names', 80
AVX2_PINS = {'ATEN_CPU_CAPABILITY': 'avx2', 'MKL_CBWR': 'AVX2', 'ONEDNN_MAX_CPU_ISA': 'AVX2'}   # as .ci/demo
# Another CPU kind: the largest difference allowed. Measured on this slice between the pins above and
# ATEN_CPU_CAPABILITY=default MKL_CBWR=COMPAT on one machine (issue 45): final loss 7.1199 against 7.1207, held-out
# 6.9311 against 6.9306 (at most 0.0008 nats); fine-tuning seeds 42.33, 42.33, 42.33 against 42.33, 42.67, 42.33
# (seed mean 0.11 points). What a real change does at step 80, measured: pretraining seed 43 instead of 42 moves the
# held-out loss by 0.097 nats (final 0.004), an LR of 4.5e-3 instead of 5e-3 by 0.040 (final 0.012).
TOLERANCE = {'loss': 0.003,   # nats, pretraining final and held-out loss: about 4x the measured spread
             'score': 2.0}    # points, the seed-mean score of the slice's cell: the comparison's default margin


def pinned_env() -> dict:
    "The environment `.ci/demo` runs in: one thread, and on an AVX2 CPU its AVX2 code paths."
    env = dict(os.environ, OMP_NUM_THREADS='1', MKL_NUM_THREADS='1', PYTHONPATH=str(ROOT), HF_HUB_OFFLINE='1',
               HF_DATASETS_OFFLINE='1', TOKENIZERS_PARALLELISM='false', MPLBACKEND='Agg')
    cpu = Path('/proc/cpuinfo').read_text() if Path('/proc/cpuinfo').is_file() else ''
    if re.search(r'\bavx2\b', cpu): env.update({k: env.get(k, v) for k, v in AVX2_PINS.items()})
    return env


def run_slice(out: Path) -> Path:
    "Pretrain and fine-tune the slice into study folder `out`; its tables (`save_side`) into `out/slice`."
    from mlmclm.finetuning.sweep import finetune_sweep
    from mlmclm.pretraining.loop import pretrain
    from mlmclm.protocol.runs import finetune_config, pretrain_config
    from mlmclm.results.compare import read_side, save_side
    from mlmclm.study.launchers import finetune_params
    from mlmclm.study.plan import get_plan, pretrain_params
    t0, plan = time.perf_counter(), get_plan('demo')
    pretrain(pretrain_config(**dict(pretrain_params(plan, plan.runs[RUN], out), stop_at_step=STOP, progress=False)))
    t1, point = time.perf_counter(), next(e for e in plan.evals if e.name == POINT)
    finetune_sweep(finetune_config(**dict(finetune_params(plan, point, out), tasks=TASK)))
    print(f'slice: pretraining {t1 - t0:.0f} s, fine-tuning {time.perf_counter() - t1:.0f} s (imports before: not counted)')
    save_side(read_side(out), out/'slice')
    return out/'slice'


def same_kind(a: dict, b: dict) -> bool:
    "Whether two provenances name the same CPU model, vector kernels (with their pins) and torch version."
    return all(a[k] == b[k] != 'not recorded' for k in ('cpu', 'kernels', 'torch'))


@pytest.fixture(scope='module')
def rerun(tmp_path_factory):
    "The slice rerun here, with the demo's pins, and its comparison with the committed reference."
    from mlmclm.results.compare import compare, read_side
    out = tmp_path_factory.mktemp('slice')
    done = subprocess.run([sys.executable, __file__, 'run', str(out)], env=pinned_env(), cwd=ROOT, capture_output=True,
                          text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    ref, new = read_side(REFERENCE), read_side(out/'slice')
    return compare(ref, new, loss_margin=TOLERANCE['loss'])


def test_the_slice_holds_the_demo_cell_and_run_it_claims():
    from mlmclm.results.compare import read_side
    ref = read_side(REFERENCE)
    assert ref.pretraining[['run', 'steps']].values.tolist() == [[RUN, STOP]]
    assert sorted(set(zip(ref.results.checkpoint_name, ref.results.dataset))) == [(POINT, TASK)]
    assert sorted(ref.results.seed) == [0, 1, 2]
    assert ref.provenance['cpu'] != 'not recorded' and ref.provenance['kernels'] != 'not recorded'


def test_the_committed_slice_is_the_committed_demos_cell():
    "The slice's fine-tuning scores are those the whole committed demo holds for the same checkpoint and task."
    import pandas as pd
    ref = pd.read_csv(REFERENCE/'results.csv')
    demo = pd.read_csv(ROOT/'tests'/'fixtures'/'demo'/'results.csv')
    demo = demo[(demo.checkpoint_name == POINT) & (demo.dataset == TASK)]
    cols = ['seed', 'lr', 'val_score', 'test_score']
    assert ref[cols].sort_values('seed').values.tolist() == demo[cols].sort_values('seed').values.tolist()


def test_a_rerun_of_the_slice_reproduces_the_committed_numbers(rerun):
    c, table = rerun, rerun.table
    assert len(table[table.kind == 'dataset']) == 1 and len(table[table.kind.str.startswith('pretraining')]) == 2, table
    if same_kind(c.a.provenance, c.b.provenance):
        assert table.identical.all(), f'same CPU kind, kernels and torch, other numbers:\n{table.to_string()}'
    else:
        losses = table[table.kind.str.startswith('pretraining')]
        assert (losses['diff'].abs() <= TOLERANCE['loss']).all(), losses.to_string()
        scores = table[table.kind == 'dataset']
        assert (scores['diff'].abs() <= TOLERANCE['score']).all(), scores.to_string()


if __name__ == '__main__':
    if sys.argv[1:2] != ['run'] or len(sys.argv) != 3: sys.exit(f'usage: {sys.argv[0]} run OUT_FOLDER')
    pins = pinned_env()
    if any(os.environ.get(k) != pins.get(k) for k in ('OMP_NUM_THREADS', 'MKL_NUM_THREADS', *AVX2_PINS)):
        os.execve(sys.executable, [sys.executable, __file__, *sys.argv[1:]], pins)   # pinned before torch is imported
    print(run_slice(Path(sys.argv[2])))
