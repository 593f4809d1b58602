"""Saved notebook outputs: which cells keep them, refreshing them, and the check the test command runs.

A notebook shows what it computes on GitHub, in JupyterLab and in the HTML docs through the outputs saved in it. Only
cells tagged `show` keep outputs (a small table, a printout, a figure); every other cell is committed without outputs,
so a re-run never leaves noise behind and the clean gate stays meaningful.

    .venv/bin/python .ci/outputs.py refresh [nbs/X.ipynb ...]   # re-execute (as nbdev_test does) and save `show` outputs
    .venv/bin/python .ci/outputs.py check                       # what the test command runs: fails on any violation
"""
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NBS = ROOT/'nbs'
TAG = 'show'
MAX_TEXT = 6_000        # characters of text output per cell
MAX_IMAGE = 400_000     # base64 characters of one image


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
        where = f'{path.relative_to(ROOT)} cell {i} ({head[:40]!r})'
        if outputs and not _tagged(cell): out.append(f'{where}: has outputs but is not tagged {TAG!r}')
        if _tagged(cell) and not outputs: out.append(f'{where}: tagged {TAG!r} but has no saved output (run refresh)')
        for o in outputs:
            if o.get('output_type') == 'error': out.append(f'{where}: saved an error')
            text, image = _size(o)
            if text > MAX_TEXT: out.append(f'{where}: {text:,} characters of text output (at most {MAX_TEXT:,})')
            if image > MAX_IMAGE: out.append(f'{where}: an image of {image:,} base64 characters (at most {MAX_IMAGE:,})')
    return out


def refresh(path: Path) -> None:
    "Execute `path` the way `nbdev_test` does (skipping `slow`/`gpu` cells) and keep the outputs of `show` cells."
    import os
    from execnb.nbio import read_nb, write_nb
    from execnb.shell import CaptureShell
    from fastcore.xtras import working_directory
    os.environ['IN_TEST'] = '1'
    nb = read_nb(path)
    def skip(cell):
        if cell.cell_type != 'code': return True
        first = [l.strip() for l in cell.source.splitlines() if l.startswith('#|')]
        return any(l in ('#| slow', '#| gpu', '#| eval: false') for l in first)
    shell = CaptureShell(path)
    with working_directory(path.parent):
        shell.run_all(nb, exc_stop=True, preproc=skip)
    for cell in nb.cells:
        if cell.cell_type == 'code' and not _tagged(cell): cell.outputs = []
        if cell.cell_type == 'code': cell.execution_count = None
    write_nb(nb, path)


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in ('refresh', 'check'):
        print(__doc__); return 2
    paths = [Path(p).resolve() for p in argv[1:]] or sorted(p for p in NBS.rglob('*.ipynb') if '.ipynb_checkpoints' not in p.parts)
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


if __name__ == '__main__': sys.exit(main(sys.argv[1:]))
