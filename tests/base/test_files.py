"""The files the package writes and reads (`mlmclm.base.files`): a torn line never eats the next row, written files
honour the umask, and shared files are read only through `read_shared`, which refuses what is not a regular file."""
import ast
import os
from pathlib import Path

import pytest

import mlmclm
from mlmclm import core
from mlmclm.base.files import (UnreadableFile, append_jsonl, atomic_write_json, atomic_write_text, read_jsonl,
                               read_shared)

from waiting import finishes


# ----------------------------------------------------------- issue 17 (data loss, silent wrong answers), items 1 and 10
def test_item1_torn_line_does_not_eat_the_next_row(tmp_path):
    f = tmp_path/'rows.jsonl'
    append_jsonl(f, {'a': 1})
    with open(f, 'a') as fh: fh.write('{"a": 2, "lo')          # a writer killed mid-line (or disk full)
    append_jsonl(f, {'a': 3})
    with pytest.warns(UserWarning, match='line 2: not JSON'):    # the torn fragment is a line of its own, named
        assert read_jsonl(f) == [{'a': 1}, {'a': 3}]


def test_item10_written_files_honour_the_umask(tmp_path):
    old = os.umask(0o022)
    try:
        atomic_write_text(tmp_path/'a.txt', 'x')
        atomic_write_json(tmp_path/'b.json', {})
        append_jsonl(tmp_path/'c.jsonl', {})
    finally: os.umask(old)
    for n in ('a.txt', 'b.json', 'c.jsonl'):
        assert (tmp_path/n).stat().st_mode & 0o777 == 0o644, n


# ---------------------------------------------------------------- third fault attack (issue 34), N7, N8, N15:
# a FIFO, a link to /dev/zero or a huge file never hangs or eats a reader
def test_read_shared_refuses_what_is_not_a_regular_file(tmp_path):
    os.mkfifo(tmp_path/'p')
    with pytest.raises(UnreadableFile, match='a named pipe'): finishes(lambda: read_shared(tmp_path/'p'))
    with pytest.raises(UnreadableFile, match='a folder'): read_shared(tmp_path)
    with pytest.raises(FileNotFoundError): read_shared(tmp_path/'missing')
    (tmp_path/'x.json').write_text('{"a": 1}')
    assert core.read_json(tmp_path/'x.json') == {'a': 1}
    with pytest.raises(UnreadableFile, match='more than the 3 allowed'): core.read_json(tmp_path/'x.json', max_bytes=3)


# the rule: no other read of a shared file in core, claims, runs, results and compaction ----------------------------
@pytest.mark.parametrize('module', ['base/files', 'base/claims', 'protocol/runs', 'results/store', 'results/compaction'])
def test_shared_files_are_read_only_through_read_shared(module):
    "Every file these modules read comes through `core.read_shared`/`open_shared` (regular files, bounded, never blocking)."
    tree = ast.parse((Path(mlmclm.__file__).parent/f'{module}.py').read_text())
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call): continue
        f = node.func
        name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else None
        if name in ('read_bytes', 'read_text'): found.append((name, node.lineno))
        if name in ('load', 'read_csv') and not (node.args and isinstance(node.args[0], ast.Call) and getattr(node.args[0].func, 'attr', '') == 'BytesIO'):
            found.append((name, node.lineno))
        if name == 'open' and isinstance(f, ast.Name):             # builtin open: only to write, or to fsync our own temp file
            mode = node.args[1].value if len(node.args) > 1 and isinstance(node.args[1], ast.Constant) else 'r'
            if 'r' in mode and ast.unparse(node.args[0]) != 'tmp': found.append(('open', node.lineno))
        if isinstance(f, ast.Attribute) and f.attr == 'open' and ast.unparse(f.value) == 'os':
            flags = ast.unparse(node.args[1]) if len(node.args) > 1 else ''
            if 'O_RDONLY' in flags and 'O_NONBLOCK' not in flags: found.append(('os.open', node.lineno))
    assert not found, f'{module}.py reads files other than through read_shared: {found}'
