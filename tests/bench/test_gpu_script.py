"""`.ci/gpu` (issue 38 item 1): the first GPU run's control flow, at tiny sizes on the CPU (`--cpu-tiny`).

One run of the script with a part made to fail, one made to hang past its cap and one that needs more time than the
budget holds: every other part still writes its JSON, the failing one its traceback, the summary judges the marks."""
import importlib.util, json, os, subprocess, sys, time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location('gpu_run', ROOT/'.ci'/'gpu_run.py')
gpu_run = importlib.util.module_from_spec(spec); spec.loader.exec_module(gpu_run)

RAN = ['machine', 'smoke', 'mfu_610m_clm', 'memory_1b', 'finetune', 'mfu_610m_mlm_dense', 'mfu_210m_clm', 'mfu_210m_mlm',
       'mfu_210m_mlm_dense', 'mfu_1b_mlm_dense']
FAILS, HANGS, TOO_LONG = 'mfu_610m_mlm', 'mfu_1b_mlm', 'mfu_1b_clm'


def _env(**extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith('MLMCLM_GPU')}
    env.update(PYTHON=sys.executable, PYTHONPATH=os.pathsep.join([str(ROOT), env.get('PYTHONPATH', '')]),
               OMP_NUM_THREADS='1', MKL_NUM_THREADS='1', **extra)
    return env


@pytest.fixture(scope='module')
def tiny_run(tmp_path_factory):
    out = tmp_path_factory.mktemp('gpu')
    t0 = time.monotonic()
    p = subprocess.run(['bash', str(ROOT/'.ci'/'gpu'), '--cpu-tiny', '--inject', f'{FAILS}=fail', '--inject', f'{HANGS}=hang',
                        '--cap', f'{HANGS}=3', '--need', f'{TOO_LONG}=100000'],
                       env=_env(OUT=str(out), MLMCLM_GPU_BUDGET_S='900'), capture_output=True, text=True, timeout=600)
    seconds = time.monotonic() - t0
    print(f'tiny run: {seconds:.0f} s\n{p.stdout}{p.stderr[-3000:]}')
    assert p.returncode == 0, p.stderr[-3000:]
    return out, json.loads((out/'status.json').read_text()), seconds


def test_every_part_writes_its_json_in_order(tiny_run):
    out, status, _ = tiny_run
    assert list(status['parts']) == [p.name for p in gpu_run.parts(True)]   # all of them, the usual order
    assert status['tiny'] and status['forked'] and 'ended' in status
    for name in RAN:
        assert status['parts'][name]['state'] == 'ok', (name, (out/f'{name}.err').read_text() if (out/f'{name}.err').exists() else '')
        assert (out/f'{name}.json').is_file() and not (out/f'{name}.err').exists(), name
        assert (out/f'{name}.log').is_file(), name


def test_part_contents(tiny_run):
    out, _, _ = tiny_run
    read = lambda n: json.loads((out/f'{n}.json').read_text())
    clm, dense = read('mfu_610m_clm'), read('mfu_610m_mlm_dense')
    assert (clm['paper_size'], clm['size'], clm['objective'], clm['baseline']) == ('610m', 'tiny', 'clm', 'hf')
    assert [s['side'] for s in clm['sides']] == ['ours', 'ours+docs', 'hf']
    assert [s['side'] for s in dense['sides']] == ['ours', 'dense-head'] and dense['objective'] == 'mlm'
    assert all(s['tokens_per_s'] > 0 for s in clm['sides'] + dense['sides'])
    ft = read('finetune')
    assert ft['task'] == 'rt_sentiment' and [s['side'] for s in ft['sides']][::3] == ['hf-trainer', 'ours packed']
    assert read('memory_1b')['source'] == 'smoke-pretrain.json'   # the smoke's pretraining part, not run twice
    assert read('memory_1b')['measured']['measured_peak_gib'] > 0
    m = read('machine')
    assert set(m) >= {'nvidia_smi', 'nproc', 'free', 'df', 'pip_freeze', 'torch'} and 'torch==' in m['pip_freeze']


def test_smoke_parts_written_as_they_end(tiny_run):
    out, _, _ = tiny_run
    smoke = json.loads((out/'smoke.json').read_text())
    assert smoke['ok'] and set(smoke['parts']) == {'benchmark', 'pretrain', 'finetune_packed', 'flash_vs_sdpa', 'fsdp2'}
    for part in ('bench', 'pretrain', 'finetune', 'agreement', 'fsdp'):
        assert json.loads((out/f'smoke-{part}.json').read_text())['ok'], part
    assert not (out/'smoke-main.json').exists()   # the command line is not a part


def test_failing_part_does_not_stop_the_others(tiny_run):
    out, status, _ = tiny_run
    assert status['parts'][FAILS]['state'] == 'error' and not (out/f'{FAILS}.json').exists()
    err = (out/f'{FAILS}.err').read_text()
    assert 'Traceback' in err and 'failure injected' in err
    later = [p.name for p in gpu_run.parts(True)]
    assert all(status['parts'][n]['state'] == 'ok' for n in later[later.index(FAILS) + 1:] if n in RAN)


def test_overrunning_part_is_killed_and_skipped_part_said_so(tiny_run):
    out, status, _ = tiny_run
    hung = status['parts'][HANGS]
    assert hung['state'] == 'timeout' and hung['limit_s'] == 3 and 3 <= hung['seconds'] < 30
    assert (out/f'{HANGS}.err').read_text().startswith('timed out: killed after')
    skipped = status['parts'][TOO_LONG]
    assert skipped['state'] == 'skipped' and 'the part needs 100000 s' in skipped['reason']
    assert not (out/f'{TOO_LONG}.json').exists() and not (out/f'{TOO_LONG}.err').exists()
    # every part ran within what was left of the budget
    assert all(s.get('limit_s', 0) <= status['deadline'] - status['started'] for s in status['parts'].values())


def test_summary(tiny_run):
    out, status, seconds = tiny_run
    text = (out/'summary.md').read_text()
    for name in status['parts']: assert f'| {name} |' in text, name
    assert f'| {TOO_LONG} | skipped | 0 | skipped:' in text and f'`{FAILS}.err`: RuntimeError' in text
    # failed on purpose: the smoke's 610m benchmark stands in (a CPU has no peak FLOP/s, hence no MFU)
    assert "- 610m MLM at 45% MFU or more: NOT MEASURED (error; no MFU in smoke-bench.json, mlm, the smoke's shape" in text
    assert '- 610m CLM at 45% MFU or more: NOT MEASURED (ok; no MFU in mfu_610m_clm (no GPU peak known))' in text
    ft = json.loads((out/'finetune.json').read_text())['ratio']
    assert f"packed fine-tuning at 2x the Trainer's step or more: {'PASS' if ft >= 2 else 'FAIL'} (x{ft:.2f}" in text
    assert f'tracebacks: `{HANGS}.err`, `{FAILS}.err`' in text
    print(f'the tiny run took {seconds:.0f} s')


def test_plan():
    part = gpu_run.Part('p', None, min_s=60, cap_s=150, about='')
    assert gpu_run.plan(part, 400, {}, {}) == ('run', 150)       # its cap
    assert gpu_run.plan(part, 90, {}, {}) == ('run', 90)         # what is left
    assert gpu_run.plan(part, 59, {}, {}) == ('skip', 'skipped: 59 s left of the budget, the part needs 60 s')
    assert gpu_run.plan(part, 59, {'p': 10}, {'p': 5}) == ('run', 5)
    assert gpu_run.plan(part, -3, {}, {})[1].startswith('skipped: 0 s left')


def test_marks_fall_back_on_the_smokes_610m_benchmark(tmp_path):
    sides = [dict(side='ours', mfu=0.47), dict(side='ours+docs', mfu=0.44, mfu_doc_lengths=0.40), dict(side='hf', mfu=0.3)]
    (tmp_path/'smoke-bench.json').write_text(json.dumps(dict(clm=dict(sides=sides), mlm=dict(sides=sides[:1]))))
    (tmp_path/'mfu_610m_mlm.json').write_text(json.dumps(dict(sides=[dict(side='ours', mfu=0.449)], batch_size=12, seq_len=1024)))
    lines = gpu_run._marks(tmp_path, dict(tiny=False, parts={}))
    assert lines[0].startswith('- 610m CLM at 45% MFU or more: PASS (ours 47.0%; ours+docs 44.0% (40.0% by document lengths); smoke-bench.json')
    assert lines[1] == '- 610m MLM at 45% MFU or more: FAIL (ours 44.9%; 12 x 1024, `mfu_610m_mlm.json`)'
    assert lines[2] == "- packed fine-tuning at 2x the Trainer's step or more: NOT MEASURED (not run)"


def test_bench_shape_keeps_the_papers_micro_batch_where_it_fits():
    h100, h200 = 79.1, 139.8
    assert gpu_run.bench_shape('610m', 'clm', 'hf', h100)['micro_batch'] == 12
    assert gpu_run.bench_shape('610m', 'clm', 'hf', h100)['documents']
    one_b = gpu_run.bench_shape('1b', 'clm', 'hf', h100)   # three 1b models do not fit beside 12 x 1024
    assert (one_b['micro_batch'], one_b['documents']) == (10, False)
    assert gpu_run.bench_shape('1b', 'clm', 'hf', h200)['micro_batch'] == 12
    from mlmclm.base.configs import ConfigError
    with pytest.raises(ConfigError, match='1b clm: no micro-batch fits 20.0 GiB'):
        gpu_run.bench_shape('1b', 'clm', 'hf', 20.0)


def test_cuda_refusing_a_fork_turns_to_spawned_parts(tmp_path):
    "A part that meets CUDA's 'forked subprocess' error runs again spawned, and so do the parts after it."
    p = subprocess.run([sys.executable, str(ROOT/'.ci'/'gpu_run.py'), '--out', str(tmp_path), '--cpu-tiny',
                        '--parts', 'machine,mfu_610m_clm,finetune', '--inject', 'machine=forkfail',
                        '--inject', 'mfu_610m_clm=fail'], env=_env(), capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    status = json.loads((tmp_path/'status.json').read_text())
    assert status['forked'].startswith('no: machine met "Cannot re-initialize CUDA in forked subprocess"')
    assert [s['state'] for s in status['parts'].values()] == ['ok', 'error', 'ok']
    assert 'Cannot re-initialize CUDA' in (tmp_path/'machine.forked.err').read_text() and (tmp_path/'machine.json').is_file()
    assert 'failure injected' in (tmp_path/'mfu_610m_clm.err').read_text() and (tmp_path/'finetune.json').is_file()


def test_spawned_parts_and_bad_names(tmp_path, capsys):
    p = subprocess.run([sys.executable, str(ROOT/'.ci'/'gpu_run.py'), '--out', str(tmp_path), '--cpu-tiny', '--spawn',
                        '--parts', 'machine,memory_1b'], env=_env(), capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    status = json.loads((tmp_path/'status.json').read_text())
    assert status['forked'] is False and list(status['parts']) == ['machine', 'memory_1b']
    assert (tmp_path/'machine.json').is_file()
    memory = json.loads((tmp_path/'memory_1b.json').read_text())   # no smoke ran: the trainer's part runs here
    assert memory['source'].startswith('run here') and memory['measured']['checks']['steps']
    with pytest.raises(SystemExit):
        gpu_run.main(['--out', str(tmp_path), '--cpu-tiny', '--parts', 'mfu_2b_clm'])
    assert "unknown part 'mfu_2b_clm'; the parts: machine, smoke, mfu_610m_clm" in capsys.readouterr().err
