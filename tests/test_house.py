"""The house rules the code base keeps: light modules stay light, imports are declared, used, made once and never of
private names, functions stay short, modules import only from the layers below them (the wings and their rooms, listed
in `.ci/layers.ini` and checked by import-linter), and rooms stay small (a module under 600 lines, exported cells of one
definition each: a median of at most 15 lines, none over 60)."""
import ast
import configparser
import json
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT/'mlmclm'
MODULES = sorted(p for p in PACKAGE.rglob('*.py') if p.name != '_modidx.py' and 'assets' not in p.relative_to(PACKAGE).parts
                 and not (p.name == '__init__.py' and not p.read_text(encoding='utf-8').strip()))
NOTEBOOKS = sorted(p.relative_to(ROOT/'nbs').as_posix() for p in (ROOT/'nbs').rglob('[0-9]*.ipynb')
                   if '.ipynb_checkpoints' not in p.parts)
WINGS = ['base', 'protocol', 'data', 'model', 'tasks', 'results', 'pretraining', 'finetuning', 'study', 'report', 'bench']


def module_name(path: Path) -> str:
    "mlmclm.<wing>.<room> of a module file (mlmclm for the package's own __init__)."
    parts = path.relative_to(ROOT).with_suffix('').parts
    return '.'.join(parts[:-1] if parts[-1] == '__init__' else parts)
# import name -> distribution name, where they differ
DIST = {'flash_attn': 'flash-attn', 'sklearn': 'scikit-learn', 'yaml': 'pyyaml'}
OPTIONAL = {'flash_attn'}   # the `gpu` extra


def _tree(path): return ast.parse(path.read_text(encoding='utf-8'))


# what needs no torch: the settings and names of the study, the planner, the task registry, the results store, the figures
LIGHT = ['', 'base.files', 'base.configs', 'base.hardware', 'base.records', 'base.claims', 'base.trackers',
         'protocol.schedules', 'protocol.run_names', 'protocol.paper', 'protocol.finetuning', 'protocol.runs',
         'data.corpus', 'model.sizes', 'tasks.examples', 'tasks.metrics', 'tasks.registry',
         'results.store', 'results.compaction', 'results.aggregation', 'results.paper_runs', 'results.ranking',
         'study.plan', 'study.launchers', 'study.commands', 'report.figures', 'report.tables', 'report.render', 'cli']


def _imports(tree: ast.Module, package: str = 'mlmclm'):
    "(node, module) of every import in `tree`, a module of `package`; relative imports resolved to absolute names."
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names: yield node, a.name
        elif isinstance(node, ast.ImportFrom):
            base = package.split('.')[:len(package.split('.')) - node.level + 1] if node.level else []
            yield node, '.'.join(base + ([node.module] if node.module else [])) if node.level else node.module


def _bound(node) -> list[tuple[str, str]]:
    "(name bound, name imported) of one import statement."
    if isinstance(node, ast.Import): return [(a.asname or a.name.split('.')[0], a.name) for a in node.names]
    return [(a.asname or a.name, a.name) for a in node.names if a.name != '*']


def _used_names(tree: ast.Module) -> set[str]:
    "Every name the module reads, string annotations included."
    names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    notes = [n.returns for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    notes += [n.annotation for n in ast.walk(tree) if isinstance(n, (ast.arg, ast.AnnAssign))]
    for s in notes:
        if isinstance(s, ast.Constant) and isinstance(s.value, str):
            names |= {n.id for n in ast.walk(ast.parse(s.value, mode='eval')) if isinstance(n, ast.Name)}
    return names


@pytest.mark.parametrize('module', LIGHT)
def test_light_modules_import_without_torch(module):
    code = f"import sys, mlmclm{'.' if module else ''}{module}; print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))"
    out = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == '[]'


def test_every_imported_package_is_declared():
    cfg = configparser.ConfigParser(delimiters=['='])
    cfg.read(ROOT/'settings.ini')
    declared = {re.split(r'[<>=!\[;]', r)[0].lower() for key in ('requirements', 'gpu_requirements', 'mteb_requirements')
                for r in cfg['DEFAULT'][key].split()}
    imported = set()
    for path in MODULES:
        for node in ast.walk(_tree(path)):
            if isinstance(node, ast.Import): imported |= {a.name.split('.')[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0: imported.add(node.module.split('.')[0])
    third_party = {m for m in imported if m not in sys.stdlib_module_names and m != 'mlmclm'}
    missing = {m for m in third_party if DIST.get(m, m).replace('_', '-').lower() not in {d.replace('_', '-') for d in declared}}
    assert not missing, f'imported by mlmclm but not in settings.ini requirements: {sorted(missing)}'


def test_functions_stay_short():
    long = [(n.end_lineno - n.lineno + 1, f'{p.name}:{n.name}') for p in MODULES for n in ast.walk(_tree(p))
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.end_lineno - n.lineno + 1 > 50]
    assert not long, f'functions over 50 lines: {sorted(long, reverse=True)}'


LAYERS = ROOT/'.ci'/'layers.ini'


def _contracts() -> configparser.ConfigParser:
    cfg = configparser.ConfigParser(); cfg.read(LAYERS, encoding='utf-8'); return cfg


def test_modules_import_only_from_the_layers_below():
    "import-linter checks every contract of `.ci/layers.ini`: wings over wings, and rooms over rooms in each wing."
    out = subprocess.run([str(Path(sys.executable).parent/'lint-imports'), str(LAYERS)], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    assert f'Contracts: {len(WINGS) + 1} kept, 0 broken.' in out.stdout, out.stdout[-1500:]


def test_every_module_is_in_a_layer_and_rooms_are_layered_in_reading_order():
    "A new room cannot escape the layers: each wing's contract lists its notebooks' modules, bottom = lowest number."
    cfg = _contracts()
    wings = {w.strip() for line in cfg['importlinter:contract:wings']['layers'].split('\n') for w in line.split('|') if w.strip()}
    assert wings == {'mlmclm.cli'} | {f'mlmclm.{w}' for w in WINGS}
    for wing in WINGS:
        listed = [l.strip() for l in cfg[f'importlinter:contract:{wing}']['layers'].split('\n') if l.strip()]
        numbered = [re.sub(r'^\d+_', '', nb.split('/')[1].removesuffix('.ipynb')) for nb in NOTEBOOKS if nb.startswith(f'{wing}/')]
        assert listed == numbered[::-1], (wing, listed, numbered)
        assert sorted(p.stem for p in (PACKAGE/wing).glob('*.py') if p.name != '__init__.py') == sorted(numbered), wing


def test_the_layer_check_can_fail(tmp_path):
    "A contract that puts a wing under one it imports from is reported broken: the check is not vacuous."
    broken = tmp_path/'broken.ini'
    broken.write_text('[importlinter]\nroot_package = mlmclm\n\n[importlinter:contract:x]\nname = upside down\n'
                      'type = layers\nlayers =\n    mlmclm.base\n    mlmclm.model\n')
    out = subprocess.run([str(Path(sys.executable).parent/'lint-imports'), str(broken)], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode != 0 and 'BROKEN' in out.stdout


def test_no_function_level_import_of_a_module_the_top_imports():
    "A function that imports what its module already imported at the top only hides where a name comes from."
    again = []
    for path in MODULES:
        tree = _tree(path)
        top = {m for node in tree.body if isinstance(node, (ast.Import, ast.ImportFrom)) for n, m in _imports(ast.Module([node], []))}
        again += [f'{path.name}:{node.lineno} {m}' for node, m in _imports(tree) if node not in tree.body and m in top]
    assert not again, f'imported again inside a function: {again}'


def test_no_unused_imports():
    unused = []
    for path in MODULES:
        tree = _tree(path)
        used = _used_names(tree)
        unused += [f'{path.name}:{node.lineno} {bound}' for node, m in _imports(tree) if m != '__future__'
                   for bound, _ in _bound(node) if bound not in used]
    assert not unused, f'imported but never used: {unused}'


def test_no_private_names_across_modules():
    "`_x` is private to its module: another module imports it neither by name nor reaches it as `module._x`."
    private = lambda name: name.startswith('_') and not name.startswith('__')
    found = []
    for path in MODULES:
        tree = _tree(path)
        package = module_name(path).rpartition('.')[0] if path.name != '__init__.py' else module_name(path)
        ours = {}   # names bound to our own modules: `import mlmclm.x as y`, `from mlmclm import x`
        for node, m in _imports(tree, package):
            if not (m or '').startswith('mlmclm'): continue
            for bound, name in _bound(node):
                if private(name.split('.')[-1]): found.append(f'{path.name}:{node.lineno} {m}.{name}')
                if isinstance(node, ast.Import) or m == 'mlmclm': ours[bound] = name
        found += [f'{path.name}:{n.lineno} {n.value.id}.{n.attr}' for n in ast.walk(tree) if isinstance(n, ast.Attribute)
                  and isinstance(n.value, ast.Name) and n.value.id in ours and private(n.attr)]
    assert not found, f'private names used across modules: {found}'


# rooms: a module does one job (issue 36); an exported cell holds one definition, shown by the cells below it
MAX_MODULE_LINES, MAX_CELL_MEDIAN, MAX_CELL_LINES = 600, 15, 60


def _exported_cells(nb: Path) -> list[int]:
    "Line counts of `nb`'s exported cells, its `#|` directives left out."
    cells = json.loads(nb.read_text(encoding='utf-8'))['cells']
    sources = [''.join(c['source']) for c in cells if c['cell_type'] == 'code']
    return [sum(not line.lstrip().startswith('#|') for line in s.splitlines()) for s in sources
            if re.match(r'\s*#\|\s*export', s)]


def test_no_module_over_600_lines():
    big = {p.name: n for p in MODULES if (n := len(p.read_text(encoding='utf-8').splitlines())) > MAX_MODULE_LINES}
    assert not big, f'modules over {MAX_MODULE_LINES} lines (split the room along a seam, as a new notebook): {big}'


@pytest.mark.parametrize('nb', NOTEBOOKS)
def test_exported_cells_are_short(nb):
    sizes = _exported_cells(ROOT/'nbs'/nb)
    if not sizes: return
    assert statistics.median(sizes) <= MAX_CELL_MEDIAN, f'{nb}: median exported cell {statistics.median(sizes)} lines'
    assert max(sizes) <= MAX_CELL_LINES, f'{nb}: an exported cell of {max(sizes)} lines (at most {MAX_CELL_LINES})'


def test_cell_rule_counts_what_it_says():
    "The counter leaves out directives and non-exported cells, and a long cell fails the rule."
    nb = {'cells': [{'cell_type': 'code', 'source': ['#| export\n', 'a = 1\n', 'b = 2']},
                    {'cell_type': 'code', 'source': ['x = 1\n'] * 80},
                    {'cell_type': 'markdown', 'source': ['#| export\n', 'text']}]}
    with tempfile.TemporaryDirectory() as d:
        path = Path(d)/'99_x.ipynb'; path.write_text(json.dumps(nb), encoding='utf-8')
        assert _exported_cells(path) == [2]
        nb['cells'][1]['source'].insert(0, '#| export\n'); path.write_text(json.dumps(nb), encoding='utf-8')
        assert _exported_cells(path) == [2, 80] and max(_exported_cells(path)) > MAX_CELL_LINES


MAX_UNSHOWN_RUN = 6   # exported cells in a row before a cell that shows them working


def _exported_runs(nb: Path) -> list[int]:
    "Lengths of `nb`'s runs of exported cells with no other code cell between them (prose demonstrates nothing)."
    runs, cur = [], 0
    for c in json.loads(nb.read_text(encoding='utf-8'))['cells']:
        if c['cell_type'] != 'code': continue
        exported = c['cell_type'] == 'code' and re.match(r'\s*#\|\s*export', ''.join(c['source']))
        if exported: cur += 1
        elif cur: runs.append(cur); cur = 0
    return runs + ([cur] if cur else [])


def test_only_a_code_cell_demonstrates():
    "Markdown between two exported cells is no demonstration: the run goes on; a code cell ends it (issue 43 item 5)."
    export, md, demo = (dict(cell_type='code', source=['#| export\n', 'x = 1']), dict(cell_type='markdown', source=['Why.']),
                        dict(cell_type='code', source=['x']))
    with tempfile.TemporaryDirectory() as d:
        path = Path(d)/'99_x.ipynb'
        path.write_text(json.dumps({'cells': [export, md, export, demo, export, md]}), encoding='utf-8')
        assert _exported_runs(path) == [2, 1]


@pytest.mark.parametrize('nb', NOTEBOOKS)
def test_definitions_are_shown_below_them(nb):
    "Each definition is followed, within a few cells, by one that demonstrates it (define, then show it working)."
    runs = _exported_runs(ROOT/'nbs'/nb)
    assert max(runs, default=0) <= MAX_UNSHOWN_RUN, \
        f'{nb}: {max(runs)} exported cells in a row with no demonstration between them (at most {MAX_UNSHOWN_RUN})'
