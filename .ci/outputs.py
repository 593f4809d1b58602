"""Saved notebook outputs: which cells keep them, refreshing them, and checking them by running the notebooks.

A notebook shows what it computes on GitHub, in JupyterLab and in the HTML docs through the outputs saved in it. Only
cells tagged `show` keep outputs (a small table, a printout, a figure); every other cell is committed without outputs,
so a re-run never leaves noise behind and the clean gate stays meaningful. The saved outputs are not decoration: the
test command runs every notebook and compares each `show` cell's fresh output with the saved one, so a value shown in
the docs is a value the code computes today (byte for byte; memory addresses aside).

    .venv/bin/python .ci/outputs.py refresh [nbs/X.ipynb ...]   # re-execute (as nbdev_test does) and save `show` outputs
    .venv/bin/python .ci/outputs.py check                       # the saved outputs' rules: only `show` cells, small
    .venv/bin/python .ci/outputs.py test [nbs/X.ipynb ...]      # nbdev_test's run of each notebook (two at a time),
                                                                #   then every `show` output compared with the saved one
"""
import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NBS = ROOT/'nbs'
TAG = 'show'
MAX_TEXT = 6_000        # characters of text output per cell
MAX_IMAGE = 400_000     # base64 characters of one image
# imported once by the server each notebook's process is forked from (`test`): third-party only, import-time only
PRELOAD = ['torch', 'torch._dynamo', 'transformers', 'transformers.modeling_utils', 'datasets', 'pandas', 'seaborn', 'accelerate',
           'execnb.shell']


def _rel(path: Path, root: Path = ROOT) -> str:
    "`path` relative to `root` where it lies inside it (a notebook outside the repository keeps its full path)."
    return str(path.relative_to(root)) if path.is_relative_to(root) else str(path)


def _tagged(cell) -> bool: return TAG in cell.get('metadata', {}).get('tags', [])


def _size(output) -> tuple[int, int]:
    "(text characters, largest image in base64 characters) of one output."
    text = ''.join(output.get('text', []))
    data = output.get('data', {})
    text += ''.join(data.get('text/plain', [])) + ''.join(data.get('text/html', [])) + ''.join(data.get('text/markdown', []))
    image = max((len(''.join(v) if isinstance(v, list) else v) for k, v in data.items() if k.startswith('image/')), default=0)
    return len(text), image


def problems(path: Path) -> list[str]:
    "Every way `path` breaks the rule above."
    nb = json.loads(path.read_text(encoding='utf-8'))
    out = []
    for i, cell in enumerate(nb['cells']):
        if cell['cell_type'] != 'code': continue
        outputs = cell.get('outputs', [])
        head = cell['source'][0].strip() if cell['source'] else ''
        where = f'{_rel(path)} cell {i} ({head[:40]!r})'
        if outputs and not _tagged(cell): out.append(f'{where}: has outputs but is not tagged {TAG!r}')
        if _tagged(cell) and not outputs: out.append(f'{where}: tagged {TAG!r} but has no saved output (run refresh)')
        for o in outputs:
            if o.get('output_type') == 'error': out.append(f'{where}: saved an error')
            text, image = _size(o)
            if text > MAX_TEXT: out.append(f'{where}: {text:,} characters of text output (at most {MAX_TEXT:,})')
            if image > MAX_IMAGE: out.append(f'{where}: an image of {image:,} base64 characters (at most {MAX_IMAGE:,})')
    return out


def _skip(cell) -> bool:
    "What `nbdev_test` leaves out: markdown, `#| eval: false`, and cells flagged `slow` or `gpu` (settings' tst_flags)."
    if cell.cell_type != 'code': return True
    first = [l.strip() for l in cell.source.splitlines() if l.startswith('#|')]
    return any(l in ('#| slow', '#| gpu', '#| eval: false') for l in first)


def execute(path: Path):
    "Run notebook `path` as `nbdev_test` runs it (its folder as working directory, IN_TEST set); the notebook, run."
    import os
    from execnb.nbio import read_nb
    from execnb.shell import CaptureShell
    from fastcore.xtras import working_directory
    os.environ['IN_TEST'] = '1'
    nb = read_nb(path)
    shell = CaptureShell(path)
    try:
        with working_directory(path.parent): shell.run_all(nb, exc_stop=True, preproc=_skip)
    except Exception as e:
        raise RuntimeError(shell.prettytb(fname=path)) from e
    return nb


def refresh(path: Path) -> None:
    "Execute `path` the way `nbdev_test` does (skipping `slow`/`gpu` cells) and keep the outputs of `show` cells."
    from execnb.nbio import write_nb
    nb = execute(path)
    for cell in nb.cells:
        if cell.cell_type == 'code' and not _tagged(cell): cell.outputs = []
        if cell.cell_type == 'code': cell.execution_count = None
    write_nb(nb, path)


def _comparable(output: dict) -> dict:
    "An output as the comparison sees it: its type, stream name, text and data; memory addresses blanked."
    import re
    join = lambda v: ''.join(v) if isinstance(v, list) else v
    blank = lambda t: re.sub(r'0x[0-9a-f]{6,}', '0x...', t)
    out = {k: output[k] for k in ('output_type', 'name') if k in output}
    if 'text' in output: out['text'] = blank(join(output['text']))
    if 'data' in output: out['data'] = {k: blank(join(v)) if k.startswith('text/') else join(v) for k, v in output['data'].items()}
    return out


def differences(path: Path, ran) -> list[str]:
    "Each `show` cell of `path` whose fresh output (in `ran`, the notebook as run) is not its saved output."
    saved = json.loads(path.read_text(encoding='utf-8'))['cells']
    out = []
    for i, (cell, fresh) in enumerate(zip(saved, ran.cells)):
        if cell['cell_type'] != 'code' or not _tagged(cell): continue
        a, b = [_comparable(o) for o in cell.get('outputs', [])], [_comparable(dict(o)) for o in fresh.get('outputs', [])]
        if a == b: continue
        first = next((f'{x}' [:160] + ' -> ' + f'{y}'[:160] for x, y in zip(a, b) if x != y), f'{len(a)} outputs saved, {len(b)} now')
        out.append(f'{_rel(path)} cell {i} ({"".join(cell["source"][:1]).strip()[:40]!r}): saved output differs '
                   f'from a fresh run: {first}')
    return out


def _test_one(path: Path) -> tuple[bool, float, list[str]]:
    "(ran without error, seconds, output differences) of one notebook."
    import time
    start = time.time()
    print(f'Starting {path}', flush=True)
    try: ran = execute(path)
    except RuntimeError as e:
        sys.stderr.write(str(e) + '\n'); print(f'- Failed {path}', flush=True)
        return False, time.time() - start, []
    print(f'- Completed {path}', flush=True)
    return True, time.time() - start, differences(path, ran)


def test(paths: list[Path], workers: int = 2) -> int:
    "Run every notebook (like `nbdev_test --n_workers 2`), then compare the `show` outputs; 1 on any failure."
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor
    # a fresh process per notebook, as nbdev_test runs them: one notebook's settings (pandas' display options,
    # matplotlib's rcParams, a library's progress bars) must not change the next one's outputs. Each is forked from a
    # server that has imported the heavy libraries once (nothing of ours, nothing run): 64 notebooks no longer pay
    # their imports each, about 3 s of a 2-core machine's CPU apiece.
    server = multiprocessing.get_context('forkserver')
    server.set_forkserver_preload(PRELOAD)
    with ProcessPoolExecutor(workers, mp_context=server, max_tasks_per_child=1) as pool:
        results = list(pool.map(_test_one, paths))
    failed = [p for p, (ok, _, _) in zip(paths, results) if not ok]
    stale = [d for _, _, diffs in results for d in diffs]
    for d in stale: print('FAIL:', d)
    for p in failed: print('FAIL: an error in', _rel(p))
    for p, (_, t, _) in sorted(zip(paths, results), key=lambda x: -x[1][1])[:8]: print(f'{_rel(p, NBS)}: {int(t)} secs')
    print(f'notebooks: {len(paths) - len(failed)} of {len(paths)} ran; {sum(map(_count_shown, paths))} shown outputs, '
          f'{len(stale)} differ from a fresh run' + (' (run `.ci/outputs.py refresh` on the notebook if the change is right)' if stale else ''))
    return 1 if failed or stale else 0


def _count_shown(path: Path) -> int: return sum(_tagged(c) for c in json.loads(path.read_text(encoding='utf-8'))['cells'])


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in ('refresh', 'check', 'test'):
        print(__doc__); return 2
    # one torch thread per notebook, as the test command runs everything: two notebooks side by side with two OpenMP
    # threads each on a 2-core machine spin-wait on one another at every parallel op (the two fine-tuning notebooks
    # took 30 to 80 s together, 3 s each alone); a refresh runs as the test does
    for threads in ('OMP_NUM_THREADS', 'MKL_NUM_THREADS'): os.environ.setdefault(threads, '1')
    paths = [Path(p).resolve() for p in argv[1:]] or sorted(p for p in NBS.rglob('*.ipynb') if '.ipynb_checkpoints' not in p.parts)
    if argv[0] == 'test': return test(paths)
    if argv[0] == 'refresh':
        for p in paths:
            print(f'refreshing {p.relative_to(ROOT)}', flush=True)
            refresh(p)
        return 0
    found = [msg for p in paths for msg in problems(p)]
    for msg in found: print('FAIL:', msg)
    shown = sum(_tagged(c) for p in paths for c in json.loads(p.read_text(encoding='utf-8'))['cells'])
    print(f'outputs: {shown} cells tagged {TAG!r} across {len(paths)} notebooks, {len(found)} problems')
    return 1 if found else 0


if __name__ == '__main__':   # run as the module `outputs`: a notebook's shell takes over `__main__` in the pool's workers
    sys.path.insert(0, str(Path(__file__).parent))
    import outputs
    sys.exit(outputs.main(sys.argv[1:]))
