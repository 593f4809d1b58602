"""pytest configuration: the helpers in this folder (the fake hub) are importable by the tests."""
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))


def pytest_configure(config):
    config.addinivalue_line('markers', 'slow: minutes of CPU or large downloads; `pytest -m slow` runs them, the test command skips them')


@pytest.fixture(scope='module')
def one_thread():
    "Torch on one thread for a module's tests (tiny models run faster so), restored afterwards; opt in with usefixtures."
    import torch
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
