from concurrent.futures import ThreadPoolExecutor

import pytest

from dpcdf.service.processes import start_server, stop
from helpers import TESTING


@pytest.fixture(scope="session")
def servers(tmp_path_factory):
    """Two servers with noise switched off (the test-only setting) and two with noise, shared by every
    test that needs only tasks of its own (each test registers fresh tasks, so tests cannot see each
    other's reports). Tests that kill, restart or reconfigure a server start their own. The four
    start together: each start is mostly a Python import (~1-2 s), and they overlap on 2 cores."""
    base = tmp_path_factory.mktemp("servers")
    plan = [(name, noise, party) for name, noise in (("exact", False), ("noisy", True)) for party in (0, 1)]
    logs = {(name, party): open(base / f"{name}{party}.log", "wb") for name, _, party in plan}

    def start(item):
        name, noise, party = item
        return start_server(party, str(base / f"{name}{party}"), noise=noise, log=logs[name, party], extra_env=TESTING)

    with ThreadPoolExecutor(len(plan)) as pool:
        started = list(pool.map(start, plan))
    procs = {}
    for (name, _, party), (proc, url) in zip(plan, started):
        procs.setdefault(name, []).append((proc, url, base / f"{name}{party}"))
    yield procs, base
    for pair in procs.values():
        for proc, _, _ in pair:
            stop(proc)
    for log in logs.values():
        log.close()


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects
def pytest_collection_modifyitems(items):
    """A test outside system/ that takes the shared real servers is a system test too."""
    for item in items:
        if "servers" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.system)
