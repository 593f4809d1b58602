"""The parts of the first GPU run (issue 38), run by `.ci/gpu` after it has set up `.venv`.

Each part runs in a child process of its own (forked from this one once `mlmclm.bench.smoke` is imported, or spawned), with
a timeout of what is left of the run's time budget (and the part's own cap); a part with less left than it needs to
start is skipped and said so. A part writes `<part>.json` the moment it ends, or `<part>.err` with its traceback (a
part killed at its timeout or by a signal gets an `.err` that says so); its stdout and stderr go to `<part>.log`.
`status.json` and `summary.md` are rewritten after every part, so an interrupted run still leaves them as far as it got.

`--cpu-tiny` runs the same parts on the CPU at tiny sizes (the test suite does, `tests/bench/test_gpu_script.py`).
"""
import argparse, inspect, json, os, re, signal, subprocess, sys, tempfile, time, traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

RESERVE_S = 5.0      # kept for the summary at the end
PAPER_MICRO_BATCH, PAPER_SEQ_LEN = 12, 1024   # the paper's pretraining micro-batch and context
MFU_MARK, FINETUNE_MARK = 0.45, 2.0           # issue 38: 610m at 45% MFU or more; packed fine-tuning at 2x the Trainer


@dataclass(frozen=True)
class Ctx:
    out: Path
    tiny: bool
    inject: dict   # part -> 'fail' | 'hang' | 'forkfail' (the tests' way to make a part fail, overrun, or fail forked)

    @property
    def device(self) -> str: return 'cpu' if self.tiny else 'cuda'


@dataclass(frozen=True)
class Part:
    name: str
    run: Callable[[Ctx], dict]   # the measurement; returns what `<name>.json` holds
    min_s: float                 # not started with less than this left
    cap_s: float                 # runs at most this long
    about: str                   # what it measures, for the summary


def write_json(path: Path, obj) -> None:
    tmp = path.with_suffix(path.suffix + '.tmp')
    tmp.write_text(json.dumps(obj, indent=1, default=str))
    os.replace(tmp, path)


def read_json(path: Path):
    try: return json.loads(path.read_text())
    except (OSError, ValueError): return None


# ---------------------------------------------------------------- the parts

def _machine(ctx: Ctx) -> dict:
    "nvidia-smi, nproc, free, df, pip freeze, and what torch sees."
    commands = dict(nvidia_smi=['nvidia-smi'], nproc=['nproc', '--all'], free=['free', '-g'], df=['df', '-h', '.', '/dev/shm'],
                    pip_freeze=[sys.executable, '-m', 'pip', 'freeze'])
    out = {}
    for name, cmd in commands.items():
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
            out[name] = p.stdout + (f'\n[exit {p.returncode}] {p.stderr}' if p.returncode else '')
        except (OSError, subprocess.TimeoutExpired) as e: out[name] = f'{type(e).__name__}: {e}'
    import torch
    from mlmclm.model.transformer import attention_kernel, default_backend
    from mlmclm.base.devices import device_peak_flops
    dev = torch.device(ctx.device)
    out['torch'] = dict(version=torch.__version__, cuda=torch.version.cuda, cuda_available=torch.cuda.is_available(),
                        threads=torch.get_num_threads())
    if dev.type == 'cuda':
        props = torch.cuda.get_device_properties(dev)
        out['torch'].update(device=props.name, capability=list(torch.cuda.get_device_capability(dev)),
                            memory_gib=props.total_memory / 2**30, bf16=torch.cuda.is_bf16_supported())
    out['torch'].update(attn_backend=default_backend(dev), attention=attention_kernel(default_backend(dev), dev),
                        peak_flops=device_peak_flops(dev))
    (ctx.out/'machine.txt').write_text('\n\n'.join(f'$ {" ".join(commands[k])}\n{v}' for k, v in out.items()
                                                  if k in commands))
    return out


def _smoke(ctx: Ctx) -> dict:
    "`mlmclm bench smoke`, each of its parts writing `smoke-<part>.json` (or `.err`) as it ends."
    import mlmclm.bench.smoke as B
    # the parts are `_smoke_<part>(dev, ...)`; `_smoke_main` (the command line) is not one
    names = [n for n in dir(B) if n.startswith('_smoke_') and callable(getattr(B, n))
             and next(iter(inspect.signature(getattr(B, n)).parameters), None) == 'dev']
    if not names: raise RuntimeError('mlmclm.bench.smoke has no _smoke_* parts any more: update .ci/gpu_run.py')
    for n in names: setattr(B, n, _written_as_it_ends(getattr(B, n), ctx.out/f"smoke-{n.removeprefix('_smoke_')}"))
    report = ctx.out/'smoke.json'
    try: B.main(['smoke', '--device', ctx.device, '--out', str(report)])
    except SystemExit as e:
        if e.code not in (0, 1, None): raise   # 1: the report says FAILED; anything else did not write one
    return json.loads(report.read_text())


def _written_as_it_ends(fn, stem: Path):
    def part(*args, **kw):
        try: result = fn(*args, **kw)
        except Exception:
            stem.with_suffix('.err').write_text(traceback.format_exc()); raise
        write_json(stem.with_suffix('.json'), result)
        return result
    return part


def bench_shape(size: str, objective: str, baseline: str, device_gib: float) -> dict:
    """Micro-batch and document masking of a pretraining benchmark at `size`: the paper's 12 × 1,024 with every side
    alive at once (each side's weights, gradients and AdamW), if `fit_settings` finds it fits as it is (no chunked
    loss, no checkpointing), else without the `ours+docs` side, else the largest micro-batch that fits. Every side is
    priced as the costliest, Hugging Face's (eager, SDPA, the LM head at every position)."""
    from mlmclm.base.configs import ConfigError
    from mlmclm.model.sizes import fit_settings, memory_estimate
    run = dict(processes=1, strategy='none', seq_len=PAPER_SEQ_LEN, objective=objective, sparse_head=False,
               compiled=False, attn_backend='sdpa', bf16=True)
    tried = []
    for mb in range(PAPER_MICRO_BATCH, 0, -1):
        for documents in ((True, False) if baseline == 'hf' else (False,)):
            sides = 2 + documents
            e = memory_estimate(size, micro_batch=mb, **run)
            others = (sides - 1) * (e['weights_gib'] + e['gradients_gib'] + e['optimizer_gib'])
            try: fit = fit_settings(size, device_gib=device_gib - others, margin=0.1, micro_batch=mb, **run)
            except ConfigError as err: tried.append(f'{mb} x {sides} sides: {err}'); continue
            if not fit['changed']:
                return dict(micro_batch=mb, documents=documents, sides=sides, estimate_gib=fit['peak_gib'],
                            other_sides_gib=others, device_gib=device_gib)
            tried.append(f"{mb} x {sides} sides: needs {fit['changed']}")
    raise ConfigError(f'{size} {objective}: no micro-batch fits {device_gib:.1f} GiB: {"; ".join(tried[-3:])}')


def _pretrain_bench(size: str, objective: str, baseline: str):
    "Ours (bf16, compiled blocks, varlen attention: the GPU's fast path) against `baseline` at `size`, the paper's shape."
    def part(ctx: Ctx) -> dict:
        import torch
        import mlmclm.bench.throughput as B
        if ctx.tiny: shape, timing = dict(micro_batch=2, documents=baseline == 'hf', seq_len=32), dict(steps=1, reps=1, warmup=1)
        else:
            gib = torch.cuda.get_device_properties(0).total_memory / 2**30
            shape = dict(bench_shape(size, objective, baseline, gib), seq_len=PAPER_SEQ_LEN)
            timing = dict(steps=4, reps=3, warmup=3)
        if ctx.tiny: torch.set_num_threads(1)
        r = B.benchmark('tiny' if ctx.tiny else size, objective, baseline, shape['micro_batch'], shape['seq_len'],
                        documents=shape['documents'], device=ctx.device, **timing)
        return dict(r, paper_size=size, shape=shape)
    return part


def _memory_1b(ctx: Ctx) -> dict:
    "The 1b trainer's measured peak beside its estimate: the smoke's pretraining part, or the same part run here."
    import mlmclm.bench.smoke as B
    from mlmclm.model.sizes import memory_estimate
    paper = memory_estimate('tiny' if ctx.tiny else '1b', strategy='none', processes=1, micro_batch=PAPER_MICRO_BATCH,
                            seq_len=PAPER_SEQ_LEN, compiled=not ctx.tiny, attn_backend='sdpa' if ctx.tiny else 'flash',
                            bf16=not ctx.tiny)
    measured = read_json(ctx.out/'smoke-pretrain.json')
    source = 'smoke-pretrain.json'
    if measured is None:
        import torch
        dev = torch.device(ctx.device)
        with tempfile.TemporaryDirectory() as tmp:
            measured = B._smoke_pretrain(dev, *B.SMOKE[dev.type]['pretrain'], Path(tmp))
        source = 'run here (the smoke left no pretraining result)'
    return dict(source=source, measured=measured, paper_config_estimate=paper)


def _finetune(ctx: Ctx) -> dict:
    "Packed fine-tuning against the transformers Trainer (4 x 8, padded, pure bf16) on rt_sentiment, SmolLM2-135M."
    import torch
    import mlmclm.bench.finetune_speed as B
    if ctx.tiny:
        torch.set_num_threads(1)
        return B.finetune_benchmark('rt_sentiment', size='tiny', steps=3, warmup=1, device='cpu', progress=True)
    return B.finetune_benchmark('rt_sentiment', steps=20, warmup=2, progress=True)


def parts(tiny: bool) -> list[Part]:
    "Most important first: the smoke, MFU at 610m, the 1b memory, fine-tuning, then the other sizes and heads."
    def p(name, run, min_s, cap_s, about):
        return Part(name, run, 1 if tiny else min_s, 120 if tiny else cap_s, about)
    mfu = lambda size, obj, base, min_s=60, cap_s=150: p(
        f"mfu_{size}_{obj}{'_dense' if base == 'dense-head' else ''}", _pretrain_bench(size, obj, base), min_s, cap_s,
        f"{size} {obj.upper()} pretraining against {'LlamaForCausalLM' if base == 'hf' else 'our dense MLM head'}")
    return [p('machine', _machine, 5, 60, 'nvidia-smi, nproc, free, df, pip freeze, torch'),
            p('smoke', _smoke, 90, 270, '`mlmclm bench smoke`: every GPU path once'),
            mfu('610m', 'clm', 'hf'), mfu('610m', 'mlm', 'hf'),
            p('memory_1b', _memory_1b, 10, 120, '1b trainer peak memory against its estimate'),
            p('finetune', _finetune, 60, 180, 'packed fine-tuning against the Trainer, SmolLM2-135M, rt_sentiment'),
            mfu('610m', 'mlm', 'dense-head'),
            mfu('210m', 'clm', 'hf'), mfu('210m', 'mlm', 'hf'), mfu('210m', 'mlm', 'dense-head'),
            mfu('1b', 'clm', 'hf'), mfu('1b', 'mlm', 'hf'), mfu('1b', 'mlm', 'dense-head')]


# ---------------------------------------------------------------- running them

def plan(part: Part, left: float, need: dict, cap: dict) -> tuple[str, float | str]:
    "('run', timeout) or ('skip', why) for `part` with `left` seconds of the budget."
    min_s, cap_s = need.get(part.name, part.min_s), cap.get(part.name, part.cap_s)
    if left < min_s: return 'skip', f'skipped: {max(left, 0):.0f} s left of the budget, the part needs {min_s:.0f} s'
    return 'run', min(cap_s, left)


def _child(part: Part, ctx: Ctx) -> int:
    "Run `part` (in its own process), writing `<name>.json` or `<name>.err`; the exit code."
    try:
        if ctx.inject.get(part.name) == 'fail': raise RuntimeError(f'{part.name}: failure injected with --inject')
        if ctx.inject.get(part.name) == 'hang': time.sleep(3600)
        if ctx.inject.get(part.name) == 'forkfail' and os.environ.get('MLMCLM_GPU_SPAWNED') != '1':
            raise RuntimeError(f'Cannot re-initialize CUDA in forked subprocess (injected into {part.name} with --inject)')
        write_json(ctx.out/f'{part.name}.json', part.run(ctx))
        return 0
    except BaseException:
        (ctx.out/f'{part.name}.err').write_text(traceback.format_exc())
        return 1
    finally:
        sys.stdout.flush(); sys.stderr.flush()


def _start(part: Part, ctx: Ctx, fork: bool) -> int:
    "The child's pid, in a session of its own (its compile workers die with it), its output in `<name>.log`."
    log = ctx.out/f'{part.name}.log'
    if not fork:
        cmd = [sys.executable, __file__, '--child', part.name, '--out', str(ctx.out)] + (['--cpu-tiny'] if ctx.tiny else [])
        cmd += [f'--inject={k}={v}' for k, v in ctx.inject.items()]
        with open(log, 'wb') as f:
            return subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, start_new_session=True,
                                    env=dict(os.environ, MLMCLM_GPU_SPAWNED='1')).pid
    sys.stdout.flush(); sys.stderr.flush()
    pid = os.fork()
    if pid: return pid
    code = 1
    try:
        os.setsid()
        fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(fd, 1); os.dup2(fd, 2)
        code = _child(part, ctx)
    finally: os._exit(code)


def run_part(part: Part, ctx: Ctx, timeout: float, fork: bool) -> dict:
    "Run `part` with `timeout`; its state: ok, error (its .err), timeout or killed (an .err written here)."
    t0 = time.monotonic()
    pid = _start(part, ctx, fork)
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done: break
        if time.monotonic() - t0 > timeout:
            try: os.killpg(pid, signal.SIGKILL)
            except ProcessLookupError: pass
            os.waitpid(pid, 0)
            seconds = time.monotonic() - t0
            (ctx.out/f'{part.name}.err').write_text(f'timed out: killed after {seconds:.0f} s (its limit: {timeout:.0f} s, '
                                                     f'what was left of the budget or its cap); see {part.name}.log\n')
            return dict(state='timeout', seconds=seconds)
        time.sleep(0.1)
    seconds = time.monotonic() - t0
    if os.WIFSIGNALED(status) or not (ctx.out/f'{part.name}.json').exists():
        err = ctx.out/f'{part.name}.err'
        if not err.exists():
            how = f'signal {os.WTERMSIG(status)}' if os.WIFSIGNALED(status) else f'exit code {os.WEXITSTATUS(status)}'
            err.write_text(f'the part died ({how}) without a result; see {part.name}.log\n')
        return dict(state='error', seconds=seconds)
    return dict(state='ok', seconds=seconds)


FORK_ERROR = 'Cannot re-initialize CUDA in forked subprocess'


def _text(path: Path) -> str: return path.read_text(errors='replace') if path.exists() else ''


def _preload(out: Path) -> bool:
    "Import the package once, so that forked parts start at once; False (and `import.err`) when it fails or CUDA is up."
    try:
        import torch, mlmclm.bench.smoke  # noqa: F401
        if torch.cuda.is_initialized(): raise RuntimeError('CUDA was initialised on import: parts are spawned, not forked')
        return True
    except Exception:
        (out/'import.err').write_text(traceback.format_exc())
        return False


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('--out', required=True, help='the folder every result goes to')
    p.add_argument('--cpu-tiny', action='store_true', default=os.environ.get('MLMCLM_GPU_SCRIPT_TINY') == '1',
                   help='the same parts on the CPU at tiny sizes (also MLMCLM_GPU_SCRIPT_TINY=1)')
    p.add_argument('--deadline', type=float, default=float(os.environ.get('MLMCLM_GPU_DEADLINE', 0)) or None,
                   help='the budget ends at this Unix time (default: MLMCLM_GPU_DEADLINE, else now + --budget)')
    p.add_argument('--budget', type=float, default=465, help='seconds from now, without a deadline')
    p.add_argument('--parts', help='comma-separated names: run only these (in the usual order)')
    p.add_argument('--spawn', action='store_true', help='start each part as a new interpreter instead of a fork')
    for flag, what in (('need', 'seconds a part needs left to start'), ('cap', 'seconds a part may run at most')):
        p.add_argument(f'--{flag}', action='append', default=[], metavar='PART=S', help=what)
    p.add_argument('--inject', action='append', default=[], metavar='PART=fail|hang|forkfail',
                   help='for tests: make a part fail, hang, or fail as CUDA does in a forked process')
    p.add_argument('--child', help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    out = Path(a.out); out.mkdir(parents=True, exist_ok=True)
    pairs = lambda items: dict(i.split('=', 1) for i in items)
    inject = pairs(a.inject)
    every = parts(a.cpu_tiny)
    names = [x.name for x in every]
    asked = a.parts.split(',') if a.parts else names
    for name in [*asked, *pairs(a.need), *pairs(a.cap), *inject]:
        if name not in names: p.error(f'unknown part {name!r}; the parts: {", ".join(names)}')
    if set(inject.values()) - {'fail', 'hang', 'forkfail'}: p.error(f'--inject takes PART=fail, hang or forkfail, not {a.inject}')
    ctx = Ctx(out, a.cpu_tiny, inject)
    if a.child: raise SystemExit(_child(next(x for x in every if x.name == a.child), ctx))
    need, cap = ({k: float(v) for k, v in pairs(d).items()} for d in (a.need, a.cap))
    deadline = a.deadline or time.time() + a.budget
    fork = not a.spawn and _preload(out)
    status = dict(tiny=a.cpu_tiny, forked=fork, started=time.time(), deadline=deadline, parts={})
    for part in (x for x in every if x.name in asked):
        left = deadline - time.time() - RESERVE_S
        action, arg = plan(part, left, need, cap)
        if action == 'skip': status['parts'][part.name] = dict(state='skipped', seconds=0, reason=arg)
        else:
            result = run_part(part, ctx, arg, fork)
            if fork and result['state'] == 'error' and FORK_ERROR in _text(out/f'{part.name}.err'):
                # something touched CUDA in this process after all: this part again, and the rest, spawned
                fork, status['forked'] = False, f'no: {part.name} met "{FORK_ERROR}" forked, and ran again spawned'
                os.replace(out/f'{part.name}.err', out/f'{part.name}.forked.err')
                action, arg = plan(part, deadline - time.time() - RESERVE_S, need, cap)
                result = run_part(part, ctx, arg, fork) if action == 'run' else dict(state='skipped', seconds=0, reason=arg)
            status['parts'][part.name] = dict(result, limit_s=round(arg, 1)) if action == 'run' else result
        s = status['parts'][part.name]
        print(f"{part.name:<20} {s['state']:<8} {s['seconds']:6.1f} s  {s.get('reason', '')}", flush=True)
        write_json(out/'status.json', status)
        (out/'summary.md').write_text(summary(out, status, every))
    status['ended'] = time.time()
    write_json(out/'status.json', status)
    (out/'summary.md').write_text(summary(out, status, every))
    print(f'summary: {out/"summary.md"}', flush=True)
    return status


# ---------------------------------------------------------------- the summary

def _pct(x): return '–' if x is None else f'{x:.1%}'


def _num(x, fmt='{:,.0f}'): return '–' if x is None else fmt.format(x)


def _measured(name: str, r: dict, out: Path) -> str:
    "One cell: what part `name` measured."
    if name == 'machine':
        t = r.get('torch', {})
        return f"{t.get('device', 'cpu')}, torch {t.get('version')} (CUDA {t.get('cuda')}), {r.get('nproc', '').strip()} CPUs, attention {t.get('attn_backend')}"
    if name == 'smoke':
        return f"{'ok' if r.get('ok') else 'FAILED'}: " + ', '.join(
            f"{k} {'ok' if v.get('ok') else 'FAILED'} ({v.get('seconds')} s)" for k, v in r.get('parts', {}).items())
    if name.startswith('mfu_'):
        sides = '; '.join(f"{s['side']} {_num(s['tokens_per_s'])} tok/s, MFU {_pct(s['mfu'])}, peak {_num(s['peak_gib'], '{:.1f}')} GiB, "
                          f"{s.get('graph_breaks')} breaks, {s.get('recompiles')} recompiles" for s in r['sides'])
        return (f"{r['size']} {r['objective']} {r['batch_size']} x {r['seq_len']}, {r.get('attention', {}).get('kernel', '')}: "
                f"{sides}; ours/baseline x{r['ratio']:.2f}")
    if name == 'memory_1b':
        m, e = r.get('measured', {}), r.get('paper_config_estimate', {})
        return (f"trainer {m.get('size')} {m.get('micro_batch')} x {m.get('seq_len')}: measured {_num(m.get('measured_peak_gib'), '{:.1f}')} GiB, "
                f"estimate {_num(m.get('estimate_gib'), '{:.1f}')} GiB, ratio {_num(m.get('measured_over_estimate'), '{:.2f}')} "
                f"(band {m.get('memory_band')}); paper config ({e.get('size')}, 12 x 1024, one process): "
                f"{_num(e.get('peak_gib'), '{:.1f}')} GiB estimated")
    if name == 'finetune':
        sides = '; '.join(f"{s['side']} {s['step_s']:.3f} s/step (x{s['ratio']:.2f})" for s in r['sides'])
        return f"{r['model']} on {r['task']}, {r['steps']} steps of {r['batch_size']}: {sides}; packed/Trainer x{r['ratio']:.2f}"
    return ''


def _marks(out: Path, status: dict) -> list[str]:
    "Issue 38's marks, judged on what was measured."
    lines = ['(tiny sizes on a CPU: the marks are judged for the control flow only)'] if status['tiny'] else []
    smoke = (read_json(out/'smoke-bench.json') or {})
    for obj in ('clm', 'mlm'):
        r, source = read_json(out/f'mfu_610m_{obj}.json'), f'mfu_610m_{obj}'
        if r is None and obj in smoke:   # the part did not end: the smoke's 610m benchmark, if it ran
            r, source = smoke[obj], f"smoke-bench.json, {obj}, the smoke's shape (`mlmclm.bench.smoke.SMOKE`)"
        ours = r and next((s for s in r['sides'] if s['side'] == 'ours'), None)
        if not ours or ours['mfu'] is None:
            state = status['parts'].get(f'mfu_610m_{obj}', {}).get('state', 'not run')
            why = state if not r else f'{state}; no MFU in {source} (no GPU peak known)'
            lines.append(f'- 610m {obj.upper()} at {MFU_MARK:.0%} MFU or more: NOT MEASURED ({why})')
        else:
            docs = next((s for s in r['sides'] if s['side'] == 'ours+docs'), None)
            shape = f"{r['batch_size']} x {r['seq_len']}, `{source}.json`" if 'batch_size' in r else source
            extra = f"; ours+docs {_pct(docs['mfu'])} ({_pct(docs['mfu_doc_lengths'])} by document lengths)" if docs else ''
            lines.append(f"- 610m {obj.upper()} at {MFU_MARK:.0%} MFU or more: {'PASS' if ours['mfu'] >= MFU_MARK else 'FAIL'} "
                         f"(ours {_pct(ours['mfu'])}{extra}; {shape})")
    r = read_json(out/'finetune.json')
    if not r: lines.append(f"- packed fine-tuning at {FINETUNE_MARK:g}x the Trainer's step or more: NOT MEASURED "
                           f"({status['parts'].get('finetune', {}).get('state', 'not run')})")
    else: lines.append(f"- packed fine-tuning at {FINETUNE_MARK:g}x the Trainer's step or more: "
                       f"{'PASS' if r['ratio'] >= FINETUNE_MARK else 'FAIL'} (x{r['ratio']:.2f}, run by run "
                       f"[{r['ratio_min']:.2f}, {r['ratio_max']:.2f}])")
    return lines


def summary(out: Path, status: dict, every: list[Part]) -> str:
    rows = ['| part | state | s | what it measured |', '|---|---|---|---|']
    for part in every:
        s = status['parts'].get(part.name)
        if s is None: continue
        r = read_json(out/f'{part.name}.json')
        if s['state'] == 'ok' and r is not None:
            try: cell = _measured(part.name, r, out)
            except Exception as e: cell = f'(unreadable: {type(e).__name__}: {e})'
        elif s['state'] == 'skipped': cell = s['reason']
        else:
            err = (out/f'{part.name}.err').read_text().strip().splitlines() if (out/f'{part.name}.err').exists() else ['']
            cell = f'`{part.name}.err`: {err[-1][:200]}'
        rows.append(f"| {part.name} | {s['state']} | {s['seconds']:.0f} | {cell.replace('|', '/')} |")
    errs = sorted(p.name for p in out.glob('*.err'))
    recompiles = {p.stem: len(re.findall('Recompiling', p.read_text(errors='replace'))) for p in sorted(out.glob('*.log'))}
    setup = (out/'setup.log').read_text(errors='replace').strip().splitlines() if (out/'setup.log').exists() else []
    mode = 'CPU, tiny sizes (--cpu-tiny)' if status['tiny'] else 'GPU'
    elapsed = time.time() - status['started']
    return '\n'.join([f'# GPU run ({mode}): issue 38', '',
                      f"{elapsed:.0f} s so far; parts forked: {status['forked']}; "
                      f"{'ended' if 'ended' in status else 'still running or interrupted'}.", '',
                      '## Marks', '', *_marks(out, status), '',
                      '## Parts (most important first)', '', *rows, '',
                      '## Read first', '',
                      *([f"- the set-up (`setup.log`): {setup[-1]}"] if setup else []),
                      f"- tracebacks: {', '.join(f'`{e}`' for e in errs) or 'none'}",
                      "- each benchmark side's `graph_breaks`, `recompiles` and `mfu` (`mfu_*.json`, the table above)",
                      "- the trainer's measured/estimate memory (`memory_1b`, `smoke-pretrain.json`): outside its band fails",
                      f"- `Recompiling` lines in the logs: {', '.join(f'{k} {v}' for k, v in recompiles.items() if v) or 'none'}",
                      ''])


if __name__ == '__main__': main()
