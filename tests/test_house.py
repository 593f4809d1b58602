"""The house rules the code base keeps: light modules stay light, imports are declared, functions stay short,
and modules import only from lower floors."""
import ast
import configparser
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MODULES = sorted(p for p in (ROOT/'mlmclm').glob('*.py') if p.name not in ('__init__.py', '_modidx.py'))
# import name -> distribution name, where they differ
DIST = {'flash_attn': 'flash-attn', 'sklearn': 'scikit-learn', 'yaml': 'pyyaml'}
OPTIONAL = {'flash_attn'}   # the `gpu` extra


def _tree(path): return ast.parse(path.read_text(encoding='utf-8'))


@pytest.mark.parametrize('module', ['vocab', 'core'])
def test_light_modules_import_without_torch(module):
    code = f"import sys, mlmclm.{module}; print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))"
    out = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == '[]'


def test_every_imported_package_is_declared():
    cfg = configparser.ConfigParser(delimiters=['='])
    cfg.read(ROOT/'settings.ini')
    declared = {re.split(r'[<>=!\[;]', r)[0].lower() for key in ('requirements', 'gpu_requirements')
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


def test_modules_import_only_from_lower_floors():
    "A notebook imports only from lower-numbered notebooks: the module's number is its floor."
    floor = {}
    for nb in (ROOT/'nbs').glob('[0-9]*.ipynb'):
        m = re.search(r'#\| default_exp (\w+)', nb.read_text(encoding='utf-8'))
        if m: floor[m.group(1)] = nb.stem.split('_')[0]
    for path in MODULES:
        mine = floor[path.stem]
        for node in ast.walk(_tree(path)):
            if not isinstance(node, ast.ImportFrom) or not node.module: continue
            name = node.module if node.level == 1 else node.module.removeprefix('mlmclm.') if node.module.startswith('mlmclm.') else None
            if name in floor:
                assert floor[name] < mine, f'{path.stem} ({mine}) imports {name} ({floor[name]})'
