"""The `mlmclm` console script: installed with the package, it hands each command's arguments, untouched, to the
`main` of the module that runs it; `--help` and unknown commands answer before anything is imported. And the package
installs cleanly: a built wheel holds every asset and the command, and the build prints no warning. Commands answer
`--help` and bad settings without a traceback."""
import configparser
import importlib
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from mlmclm.cli import COMMANDS, main

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = Path(sys.executable).parent/'mlmclm'   # where pip put the console script of this environment


@pytest.mark.parametrize('command', sorted(COMMANDS))
def test_every_command_reaches_its_modules_main_with_the_arguments_untouched(command, monkeypatch):
    module, head, _ = COMMANDS[command]
    seen = []
    monkeypatch.setattr(importlib.import_module(module), 'main', seen.append)
    assert main([command, '--flag', 'a value', '-x', '--', 'rest']) == 0
    assert seen == [head + ['--flag', 'a value', '-x', '--', 'rest']]


def test_the_study_commands_are_the_studys_subcommands():
    assert {c: COMMANDS[c][:2] for c in ('plan', 'run', 'status')} == {c: ('mlmclm.study.commands', [c]) for c in ('plan', 'run', 'status')}
    assert COMMANDS['figures'][0] == 'mlmclm.report.render' and COMMANDS['bench'][0] == 'mlmclm.bench.smoke'


def test_settings_install_the_command():
    cfg = configparser.ConfigParser(delimiters=['='])
    cfg.read(ROOT/'settings.ini')
    assert cfg['DEFAULT']['console_scripts'].split() == ['mlmclm=mlmclm.cli:main']


def _run(*args, cwd):
    "The installed script, from a folder outside the repository, with a PATH that does not hold the virtual environment."
    env = {**os.environ, 'PATH': '/usr/bin:/bin'}
    return subprocess.run([str(SCRIPT), *args], capture_output=True, text=True, cwd=cwd, env=env, timeout=120)


def test_the_installed_script_runs_without_the_environment_on_path(tmp_path):
    assert SCRIPT.is_file(), f'{SCRIPT} is missing: reinstall the package (bash .ci/setup)'
    out = _run('--help', cwd=tmp_path)
    assert out.returncode == 0 and out.stdout.startswith('usage: mlmclm COMMAND'), out
    assert all(f'  {c} ' in out.stdout for c in COMMANDS)
    out = _run('plot', cwd=tmp_path)
    assert out.returncode == 2 and "unknown command 'plot'" in out.stderr and 'figures' in out.stderr, out
    out = _run(cwd=tmp_path)
    assert out.returncode == 2 and 'usage: mlmclm' in out.stderr, out


def test_a_commands_help_is_its_modules_own(tmp_path):
    out = _run('figures', '--help', cwd=tmp_path)
    assert out.returncode == 0 and '--results' in out.stdout and '--scale' in out.stdout, out
    out = _run('figures', '--scale', 'huge', cwd=tmp_path)   # the module's parser checks its arguments
    assert out.returncode == 2 and "invalid choice: 'huge'" in out.stderr, out


WARNING = re.compile(r'\w*(?:Warning|InformationOnly)\b.*')   # setuptools' warnings, as pip or the build hook print them


def _sources(tmp_path: Path) -> Path:
    "What a build reads: setup.py, settings.ini, README.md and the package, copied into `tmp_path`/src."
    src = tmp_path/'src'
    src.mkdir()
    for name in ('setup.py', 'settings.ini', 'README.md'): shutil.copy(ROOT/name, src/name)
    shutil.copytree(ROOT/'mlmclm', src/'mlmclm', ignore=shutil.ignore_patterns('__pycache__', '*.pyc'))
    return src


def test_a_built_wheel_holds_the_assets_and_the_command_and_builds_without_warnings(tmp_path):
    src = _sources(tmp_path)
    r = subprocess.run([sys.executable, '-m', 'pip', 'wheel', '--no-deps', '--no-build-isolation', '--no-index', '-v',
                        '-w', str(tmp_path/'dist'), str(src)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    wheel = zipfile.ZipFile(next((tmp_path/'dist').glob('mlmclm-*.whl')))
    names = set(wheel.namelist())
    assets = {p.relative_to(src).as_posix() for p in (src/'mlmclm'/'assets').rglob('*') if p.is_file()}
    assert assets and assets <= names, sorted(assets - names)
    assert 'mlmclm/assets/tokenizer/tokenizer.json' in names and not any('__pycache__' in n for n in names)
    assert 'mlmclm = mlmclm.cli:main' in wheel.read(next(n for n in names if n.endswith('entry_points.txt'))).decode()
    # e.g. "Package 'mlmclm.assets.tokenizer' is absent from the `packages` configuration" (before the fix)
    assert not WARNING.findall(r.stdout + r.stderr), WARNING.findall(r.stdout + r.stderr)


def test_an_editable_install_builds_without_warnings(tmp_path):
    "`pip install -e .` runs this hook; setuptools' notice about an import-hook finder was printed as a warning."
    src = _sources(tmp_path)
    code = 'import setuptools.build_meta as b; print(b.build_editable("out"))'
    r = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, cwd=src, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert not WARNING.findall(r.stdout + r.stderr), WARNING.findall(r.stdout + r.stderr)
    wheel = zipfile.ZipFile(next((src/'out').glob('*.whl')))
    pth = [wheel.read(n).decode().strip() for n in wheel.namelist() if n.endswith('.pth')]
    assert pth == [str(src)], pth                                     # the package is imported from the sources


# ---------------------------------- issue 39 item 5: command lines answer `--help` and bad settings without a traceback
def _mlmclm(capsys, *args) -> tuple[int, str, str]:
    """(exit status, stdout, stderr) of `mlmclm ARGS`, run in this process by the console script's `main` (the
    installed script itself is run above): any exception but the parsers' exits fails the test as a traceback would."""
    try: status = main(list(args))
    except SystemExit as stop: status = stop.code
    out = capsys.readouterr()
    return status, out.out, out.err


def test_pretrain_help_exits_0_with_the_usage_on_stdout(capsys):
    status, out, err = _mlmclm(capsys, 'pretrain', '--help')
    assert status == 0, err
    assert out.startswith('usage: mlmclm pretrain demo | run') and 'schedule' in out


def test_pretrain_without_a_subcommand_still_exits_2_with_the_usage_on_stderr(capsys):
    status, out, err = _mlmclm(capsys, 'pretrain')
    assert status == 2 and err.startswith('usage:') and not out


def test_pretrain_run_with_a_bad_setting_prints_one_error_line_and_exits_2(capsys):
    status, _, err = _mlmclm(capsys, 'pretrain', 'run', 'schedule=foo')
    assert status == 2 and err.startswith("error: schedule='foo'") and err.count('\n') == 1, err
    status, _, err = _mlmclm(capsys, 'pretrain', 'run', 'total_steps')
    assert status == 2 and err.startswith("error: 'total_steps' is not key=value"), err


def test_bench_help_names_the_smoke_subcommand(capsys):
    status, out, _ = _mlmclm(capsys, 'bench', '--help')
    assert status == 0 and 'smoke' in out and 'smoke --help' in out
