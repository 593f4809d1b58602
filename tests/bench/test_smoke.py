"""The benchmark's command line (`mlmclm bench`, run by `mlmclm.bench.smoke`) end to end: ours vs Hugging Face in one
run, last line `ratio=...`, results on disk; the smoke command of the first GPU run, at tiny sizes on a CPU, and
the parts of the smoke that judge what they report."""
import json
import subprocess
import sys

import pytest
import torch

from mlmclm.base.files import project_root
from mlmclm.cli import COMMANDS

SMALL = ['--size', 'tiny', '--batch-size', '2', '--seq-len', '32', '--steps', '1', '--reps', '2', '--warmup', '1']


def _bench(*args, out):
    return subprocess.run([sys.executable, '-m', 'mlmclm.bench.smoke', *SMALL, '--out', str(out), *args],
                          capture_output=True, text=True, cwd=project_root(), timeout=300)


def test_cli_clm_against_hf_prints_ratio_and_writes_results(tmp_path):
    run = _bench('--objective', 'clm', out=tmp_path)
    assert run.returncode == 0, run.stderr[-3000:]
    lines = run.stdout.strip().splitlines()
    assert lines[-1].startswith('ratio=') and float(lines[-1].split('=')[1]) > 0
    result = json.loads((tmp_path/'tiny-clm-hf.json').read_text())
    assert [s['side'] for s in result['sides']] == ['ours', 'ours+docs', 'hf']
    assert result['pipeline']['pipeline_tokens_per_s'] > 0 and result['finetune']['examples_per_s'] > 0
    assert result['embedding']['ours_examples_per_s'] > 0
    assert float(lines[-1].split('=')[1]) == round(result['ratio'], 3)
    csv = (tmp_path/'tiny-clm-hf.csv').read_text().splitlines()
    assert csv[0].startswith('size,objective,baseline') and len(csv) == 4
    assert (tmp_path/'tiny-clm-hf.png').read_bytes()[:4] == b'\x89PNG'


def test_cli_mlm_sparse_against_dense_head_with_chunked_loss(tmp_path):
    run = _bench('--objective', 'mlm', '--baseline', 'dense-head', '--no-extras', '--no-documents', '--ce-chunk', '16',
                 out=tmp_path)
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.strip().splitlines()[-1].startswith('ratio=')
    result = json.loads((tmp_path/'tiny-mlm-dense-head.json').read_text())
    assert [s['side'] for s in result['sides']] == ['ours', 'dense-head'] and result['options']['ce_chunk'] == 16


def _refused(capsys, *args) -> tuple[int, str]:
    "(exit status, standard error) of `mlmclm bench ARGS` refused by its parser, run in this process: nothing starts."
    from mlmclm.bench.smoke import main
    with pytest.raises(SystemExit) as stop: main(list(args))
    return stop.value.code, capsys.readouterr().err


def test_cli_refuses_bad_arguments(tmp_path, capsys):
    from mlmclm.bench.smoke import main
    with pytest.raises(ValueError, match="baseline='dense-head' compares MLM heads"):
        main([*SMALL, '--objective', 'clm', '--baseline', 'dense-head', '--out', str(tmp_path)])
    status, err = _refused(capsys, *SMALL, '--size', '7b', '--out', str(tmp_path))
    assert status == 2 and 'invalid choice' in err


def test_cli_finetune_against_the_trainer(tmp_path):
    "`--finetune` with a tiny model: the Trainer and our three sides run, report tokens, and end with the ratio."
    run = subprocess.run([sys.executable, '-m', 'mlmclm.bench.smoke', '--finetune', 'rt_sentiment', '--baseline', 'hf-trainer',
                          '--size', 'tiny', '--steps', '3', '--max-tokens', '1024', '--out', str(tmp_path)],
                         capture_output=True, text=True, cwd=project_root(), timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    lines = run.stdout.strip().splitlines()
    result = json.loads((tmp_path/'finetune-rt_sentiment-tiny.json').read_text())
    assert lines[-1] == f"ratio={result['ratio']:.3f}" and result['ratio'] > 0
    sides = {s['side']: s for s in result['sides']}
    assert list(sides) == ['hf-trainer', 'ours mb4', 'ours mb32', 'ours packed']
    assert sides['ours packed']['computed_tokens'] == sides['ours packed']['real_tokens'] == sides['hf-trainer']['real_tokens']
    assert sides['hf-trainer']['padding_waste'] > 0 and sides['ours packed']['padding_waste'] == 0
    assert all(f"{name:<12}" in run.stdout for name in sides)


def test_cli_finetune_refuses_bad_combinations(tmp_path, capsys):
    from mlmclm.base.configs import ConfigError
    from mlmclm.bench.smoke import main
    for args, message in ((['--finetune', 'rt_sentiment', '--baseline', 'hf'], '--finetune compares against --baseline hf-trainer'),
                          (['--finetune', 'rt_sentiment', '--size', 'tiny', '--checkpoint', 'x'], 'not both'),
                          (['--baseline', 'hf-trainer'], 'go with --finetune TASK')):
        status, err = _refused(capsys, *args, '--out', str(tmp_path))
        assert status == 2 and message in err, err[-2000:]
    with pytest.raises(ConfigError, match='the Trainer baseline runs sequence classification tasks'):
        main(['--finetune', 'tweet_ner', '--size', 'tiny', '--out', str(tmp_path)])


def test_smoke_runs_every_gpu_path_at_tiny_sizes_on_cpu(tmp_path):
    run = subprocess.run([sys.executable, '-m', 'mlmclm.bench.smoke', 'smoke', '--device', 'cpu', '--out', str(tmp_path/'s.json')],
                         capture_output=True, text=True, cwd=project_root(), timeout=600)
    report = json.loads((tmp_path/'s.json').read_text())
    assert run.returncode == 0, (run.stdout[-3000:], run.stderr[-3000:])
    assert report['ok'] and sorted(report['parts']) == ['benchmark', 'finetune_packed', 'flash_vs_sdpa', 'fsdp2', 'pretrain']
    assert report['parts']['finetune_packed']['host_syncs'] == {}
    assert report['parts']['fsdp2']['block_graph_calls'] == [2 * report['parts']['fsdp2']['layers']] * 2
    assert report['parts']['pretrain']['measured_peak_gib'] > 0 and report['attention']['backend'] == 'sdpa'


# Issue 36 item 4, the benchmark split: `mlmclm bench` runs from `mlmclm.bench.smoke`.
def test_the_bench_command_dispatches_to_the_room_above_the_three_it_runs():
    import mlmclm.bench.smoke as run
    from mlmclm import bench, bench_finetune
    assert COMMANDS['bench'][0] == 'mlmclm.bench.smoke'
    assert (run.benchmark, run.finetune_benchmark) == (bench.benchmark, bench_finetune.finetune_benchmark)
    assert run._parser().prog == 'mlmclm bench'


# ------------------------------------------- issue 33 item 12: the smoke judges what it reports (tiny sizes on the CPU)
def _stub_parts(monkeypatch, **results):
    import mlmclm.bench.smoke as bench
    for name in ('_smoke_bench', '_smoke_pretrain', '_smoke_finetune', '_smoke_agreement', '_smoke_fsdp'):
        monkeypatch.setattr(bench, name, results.get(name, lambda *a, **k: dict(ok=True)))
    return bench


def test_a_failing_part_keeps_its_traceback(tmp_path, monkeypatch):
    def broken(*a, **k): raise ValueError('the kernel said no')
    bench = _stub_parts(monkeypatch, _smoke_agreement=broken)
    report = bench.smoke('cpu', tmp_path/'s.json')
    part = json.loads((tmp_path/'s.json').read_text())['parts']['flash_vs_sdpa']
    assert not report['ok'] and part['error'] == 'ValueError: the kernel said no'
    assert 'Traceback (most recent call last)' in part['traceback'] and 'in broken' in part['traceback']


def test_each_part_starts_after_a_collection(tmp_path, monkeypatch):
    import weakref
    class Cycle: pass
    c = Cycle(); c.me = c; c.big = torch.zeros(1000); alive = weakref.ref(c); del c   # freed only by a cyclic GC
    seen = []
    bench = _stub_parts(monkeypatch, _smoke_bench=lambda *a, **k: seen.append(alive() is None) or dict(ok=True))
    import gc
    gc.disable()
    try: bench.smoke('cpu', tmp_path/'s.json')
    finally: gc.enable()
    assert seen == [True]


def test_graph_breaks_in_compiled_sides_fail_the_benchmark_part(monkeypatch):
    import mlmclm.bench.smoke as bench
    def fake(size, objective, *a, **k):
        side = dict(side='ours', tokens_per_s=1.0, ratio=1.0, mfu=None, mfu_doc_lengths=None, peak_gib=None,
                    compiled_frames=1, recompiles=0, recompile_limit_hits=0, graph_breaks=breaks)
        return dict(sides=[side], options={}, eager_fallback=False, attention={})
    monkeypatch.setattr(bench, 'benchmark', fake)
    breaks = 0; assert bench._smoke_bench(torch.device('cpu'), 'tiny', 2, 32, 1)['ok']
    breaks = 5; assert not bench._smoke_bench(torch.device('cpu'), 'tiny', 2, 32, 1)['ok']


def test_the_pretraining_part_fails_on_a_recompile_and_on_memory_outside_the_band(tmp_path, monkeypatch):
    import mlmclm.bench.smoke as bench
    dev = torch.device('cpu')
    good = bench._smoke_pretrain(dev, 'tiny', 2, 32, tmp_path/'a')
    assert good['ok'] and good['checks'] == dict(steps=True, memory=True, graph_breaks=True, recompiles=True), good
    assert 0.8 <= good['measured_over_estimate'] <= 1.3 and good['dynamo']['recompiles'] == 0
    import mlmclm.pretraining.loop as loop
    real, steps = loop.train_step, []
    def recompiling(*a, **k):   # a second step during which dynamo compiles a frame again (a guard failed)
        steps.append(len(steps))
        if len(steps) == 2: f = torch.compile(lambda x: x + 1, backend='eager'); f(torch.ones(2)); f(torch.ones(2, dtype=torch.long))
        return real(*a, **k)
    class NoMeter:   # dynamo compiles nothing while a dispatch mode (the CPU's `MemoryMeter`) is active
        peak = 0
        def __enter__(self): return self
        def __exit__(self, *exc): return False
    with monkeypatch.context() as m:
        m.setattr(loop, 'train_step', recompiling); m.setattr(bench, 'MemoryMeter', NoMeter)
        r = bench._smoke_pretrain(dev, 'tiny', 2, 32, tmp_path/'b')
    assert not r['ok'] and r['checks']['recompiles'] is False and r['dynamo']['recompiles'] >= 1
    fit = bench.fit_settings
    monkeypatch.setattr(bench, 'fit_settings', lambda *a, **k: dict(fit(*a, **k), peak_gib=fit(*a, **k)['peak_gib'] * 2))
    r = bench._smoke_pretrain(dev, 'tiny', 2, 32, tmp_path/'c')        # an estimate twice too high: measured/estimate ~0.6
    assert not r['ok'] and r['checks']['memory'] is False and r['measured_over_estimate'] < 0.8
