"""Issue 44 item 2: every command's and subcommand's `--help`, reached through `mlmclm`, names itself as the user
called it (`usage: mlmclm <command> ...`, never a module's `python -m` form) and lists all of its subcommands, those
that a later module runs (`SUBCOMMANDS`) among them. The walk covers every key of `COMMANDS` and `SUBCOMMANDS`."""
import contextlib
import io
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from mlmclm.cli import COMMANDS, SUBCOMMANDS, main

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = Path(sys.executable).parent/'mlmclm'

# every subcommand of each command, as its module's `main` dispatches them (plus those of `SUBCOMMANDS`)
SUBS = {'results': ['health', 'compact', 'rank'], 'paper-runs': ['import'], 'data': ['build-store', 'verify-store'],
        'bench': ['smoke'], 'pretrain': ['demo', 'run', 'seal-state']}
ONE_USAGE = {'pretrain', 'bench'}   # commands whose usage is written by hand, one line naming every subcommand
ARGPARSE_SUBS = re.compile(r'^usage: mlmclm \S+ \[-h\] \{([^}]+)\} \.\.\.')   # argparse's list of subcommands


def helped(*words) -> str:
    "What `mlmclm WORDS... --help` prints on stdout; it must exit 0."
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try: code = main([*words, '--help'])
        except SystemExit as e: code = e.code
    assert code in (0, None), (words, code, err.getvalue())
    return out.getvalue()


def test_the_table_of_subcommands_holds_those_of_later_modules():
    assert all(sub in SUBS[c] for c, sub in SUBCOMMANDS)
    assert set(SUBS) <= set(COMMANDS)


@pytest.mark.parametrize('command', sorted(COMMANDS))
def test_every_commands_help_names_it_and_lists_its_subcommands(command):
    text = helped(command)
    usage = text.split('\n\n')[0]
    assert text.startswith(f'usage: mlmclm {command} ') and 'python -m' not in text, text[:500]
    listed = ARGPARSE_SUBS.match(usage)
    if command in ONE_USAGE:
        assert all(re.search(rf'\b{re.escape(s)}\b', usage) for s in SUBS[command]), usage
    elif command in SUBS:
        assert listed and sorted(listed.group(1).split(',')) == sorted(SUBS[command]), usage
        for s in SUBS[command]: assert re.search(rf'^    {re.escape(s)}\b', text, re.M), (s, text)   # with its line of help
    else:
        assert listed is None, usage   # a command without subcommands lists none


@pytest.mark.parametrize('command, sub', sorted((c, s) for c, subs in SUBS.items() for s in subs))
def test_every_subcommands_help_names_the_command_and_itself(command, sub):
    text = helped(command, sub)
    assert 'python -m' not in text, text[:500]
    if command == 'pretrain':   # one usage for its three subcommands
        assert text.startswith(f'usage: mlmclm {command} ') and f' {sub} ' in text.split('\n')[0], text[:300]
    else:
        assert text.startswith(f'usage: mlmclm {command} {sub} '), text[:300]


def test_a_module_run_directly_still_names_its_python_m_form():
    text = subprocess.run([sys.executable, '-m', 'mlmclm.results.compaction', '--help'], capture_output=True, text=True,
                          cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)), timeout=120).stdout
    assert text.startswith('usage: python -m mlmclm.results.compaction [-h] {health,compact}'), text[:300]


def test_the_installed_script_lists_rank_under_results(tmp_path):
    "The issue's symptom, through the console script a user runs."
    if not SCRIPT.is_file(): pytest.skip(f'{SCRIPT} is missing (bash .ci/setup installs it)')
    r = subprocess.run([str(SCRIPT), 'results', '--help'], capture_output=True, text=True, cwd=tmp_path,
                       env=dict(os.environ, PYTHONPATH=str(ROOT)), timeout=120)
    assert r.returncode == 0 and r.stdout.startswith('usage: mlmclm results [-h] {rank,health,compact}'), r
    assert re.search(r'^    rank\s+rank clusters', r.stdout, re.M), r.stdout
