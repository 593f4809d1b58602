"""The files the package writes and reads (`mlmclm.base.files`): a torn line never eats the next row, written files
honour the umask, and shared files are read only through `read_shared`, which refuses what is not a regular file."""
import os

import pytest

from mlmclm.base.files import append_jsonl, atomic_write_json, atomic_write_text, read_jsonl


# ---------------------------------------------------------------- issue 17 (data loss, silent wrong answers), items 1 and 10
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
