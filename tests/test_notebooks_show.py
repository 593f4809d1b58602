"""Notebooks that show their work (issue 43, item 5): below every exported cell that defines public names, its first
demonstration keeps its output (a cell tagged `show`: `.ci/outputs.py`), and prose comes at least every 60 code lines.
The test command re-runs every notebook and compares each shown output with the saved one (`.ci/outputs.py test`).

Not every room meets both rules yet. `tests/fixtures/house_debt.json` lists, per notebook, the definitions still shown
by no saved output and the longest stretch of code without prose, as measured when the rules came in; the list may only
shrink: a new definition must be shown, a listed one that gets shown must leave the list (`python
tests/test_notebooks_show.py write` rewrites it), and no stretch may grow beyond max(60, its listed length)."""
import ast
import json
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted(p.relative_to(ROOT/'nbs').as_posix() for p in (ROOT/'nbs').rglob('[0-9]*.ipynb')
                   if '.ipynb_checkpoints' not in p.parts)
DEBT = ROOT/'tests'/'fixtures'/'house_debt.json'
SHOW = 'show'
MAX_CODE_LINES_WITHOUT_PROSE = 60


def _cells(nb: str) -> list[dict]: return json.loads((ROOT/'nbs'/nb).read_text(encoding='utf-8'))['cells']


def _is_export(c: dict) -> bool:
    return c['cell_type'] == 'code' and re.match(r'\s*#\|\s*export', ''.join(c['source'])) is not None


def public_names(c: dict) -> list[str]:
    "Public names an exported cell defines (what its module's __all__ gets from it)."
    src = '\n'.join(l for l in ''.join(c['source']).splitlines() if not l.lstrip().startswith('#|'))
    names = []
    for n in ast.parse(src).body:
        if isinstance(n, (ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef)): names.append(n.name)
        elif isinstance(n, (ast.Assign, ast.AnnAssign)):
            for t in (n.targets if isinstance(n, ast.Assign) else [n.target]):
                names += [x.id for x in ast.walk(t) if isinstance(x, ast.Name)]
    return [n for n in names if not n.startswith('_')]


def unshown_definitions(cells: list[dict]) -> list[str]:
    "Public definitions shown by no saved output in the code cells below them, up to the next exported cell."
    out = []
    for i, c in enumerate(cells):
        if not _is_export(c) or not (names := public_names(c)): continue
        below = []
        for d in cells[i + 1:]:
            if _is_export(d): break
            below.append(d)
        if not any(d['cell_type'] == 'code' and SHOW in d.get('metadata', {}).get('tags', []) and d.get('outputs')
                   for d in below): out.append(', '.join(names))
    return out


def longest_stretch_without_prose(cells: list[dict]) -> int:
    "The most non-blank code lines (directives aside) between two markdown cells."
    run = worst = 0
    for c in cells:
        if c['cell_type'] == 'markdown': run = 0; continue
        run += sum(1 for l in ''.join(c['source']).splitlines() if l.strip() and not l.lstrip().startswith('#|'))
        worst = max(worst, run)
    return worst


def measure() -> dict:
    "Per notebook: its unshown definitions and its longest stretch without prose, where either breaks a rule."
    out = {}
    for nb in NOTEBOOKS:
        cells = _cells(nb)
        unshown, stretch = unshown_definitions(cells), longest_stretch_without_prose(cells)
        if unshown or stretch > MAX_CODE_LINES_WITHOUT_PROSE: out[nb] = dict(unshown=unshown, stretch=stretch)
    return out


def _debt() -> dict: return json.loads(DEBT.read_text(encoding='utf-8'))


@pytest.mark.parametrize('nb', NOTEBOOKS)
def test_every_public_definition_is_shown_unless_listed(nb):
    listed = set(_debt().get(nb, {}).get('unshown', []))
    unshown = set(unshown_definitions(_cells(nb)))
    assert not unshown - listed, f'{nb}: shown by no saved output below them (tag a demonstration `show`): {sorted(unshown - listed)}'
    assert not listed - unshown, (f'{nb}: now shown, so leave {DEBT.name}: {sorted(listed - unshown)} '
                                  f'(python tests/test_notebooks_show.py write)')


@pytest.mark.parametrize('nb', NOTEBOOKS)
def test_prose_at_least_every_60_code_lines_unless_listed(nb):
    listed = _debt().get(nb, {}).get('stretch', 0)
    stretch = longest_stretch_without_prose(_cells(nb))
    if listed <= MAX_CODE_LINES_WITHOUT_PROSE:
        assert stretch <= MAX_CODE_LINES_WITHOUT_PROSE, f'{nb}: {stretch} code lines without a sentence between them (at most 60)'
    else:
        assert stretch <= listed, f'{nb}: {stretch} code lines without a sentence between them (listed: {listed}, the rule: 60)'
        assert stretch == listed, f'{nb}: its longest stretch without prose is shorter now ({stretch}): rewrite {DEBT.name}'


def test_the_counters_count_what_they_say():
    "A shown demonstration counts, an unshown one or a markdown cell does not; prose resets the stretch."
    code = lambda src, tags=(), outputs=(): dict(cell_type='code', source=src, metadata=dict(tags=list(tags)), outputs=list(outputs))
    md = dict(cell_type='markdown', source='Why.', metadata={})
    out = [dict(output_type='stream', name='stdout', text='1\n')]
    cells = [code('#| export\ndef f(): return 1\ndef _g(): pass'), code('f()', [SHOW], out),
             code('#| export\nX = 2'), md, code('X', [SHOW]),          # tagged, but nothing saved: not shown
             code('#| export\ndef _private(): pass'),                  # no public name: nothing to show
             code('#| export\nclass C: pass'), code('C()', [], out)]   # an output, but not kept (untagged)
    assert unshown_definitions(cells) == ['X', 'C']
    assert longest_stretch_without_prose([code('a\n\nb\n#| hide'), code('c'), md, code('d')]) == 3


def test_the_list_names_only_notebooks_that_exist():
    assert set(_debt()) <= set(NOTEBOOKS), sorted(set(_debt()) - set(NOTEBOOKS))


if __name__ == '__main__':
    if sys.argv[1:] != ['write']: sys.exit(f'usage: {sys.argv[0]} write')
    m = measure()
    DEBT.write_text(json.dumps(m, indent=1) + '\n', encoding='utf-8')
    print(f'{sum(len(d["unshown"]) for d in m.values())} unshown definitions and '
          f'{sum(d["stretch"] > MAX_CODE_LINES_WITHOUT_PROSE for d in m.values())} notebooks with long stretches listed')
