"""System tests: each starts real server processes (the session-scoped `servers` pair of
tests/service/conftest.py, its own `start_server` pairs, or the `dpcdf` CLI as a subprocess), on
loopback with real HPKE and SQLite. Every test collected here is marked `system`, so
`pytest -m "not system"` runs the in-process tests alone. This folder's harness (`deviating.py`) is
imported by name: pytest puts this folder on sys.path as it does tests/ (for `helpers`) and
tests/service (for `test_malicious_clients`), each holding a conftest.py and no __init__.py."""
from pathlib import Path

import pytest

HERE = Path(__file__).parent


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects
def pytest_collection_modifyitems(items):
    for item in items:
        if HERE in item.path.parents:
            item.add_marker(pytest.mark.system)
