"""pytest configuration: the helpers in this folder (the fake hub) are importable by the tests."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))


def pytest_configure(config):
    config.addinivalue_line('markers', 'slow: minutes of CPU or large downloads; `pytest -m slow` runs them, the test command skips them')
