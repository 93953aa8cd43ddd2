import pytest

from dpcdf.service.processes import start_server, stop
from helpers import TESTING


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    """Two servers with noise switched off (the test-only setting) and two with noise, per module."""
    base = tmp_path_factory.mktemp("servers")
    procs = {}
    for name, noise in (("exact", False), ("noisy", True)):
        pair = []
        for party in (0, 1):
            log = open(base / f"{name}{party}.log", "wb")
            proc, url = start_server(party, str(base / f"{name}{party}"), noise=noise, log=log, extra_env=TESTING)
            pair.append((proc, url, base / f"{name}{party}"))
        procs[name] = pair
    yield procs, base
    for pair in procs.values():
        for proc, _, _ in pair:
            stop(proc)
