import os
import secrets

from hypothesis import HealthCheck, settings

# numba compiles on first use, so the first example of a test can be slow: no per-example deadline.
settings.register_profile("default", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("thorough", deadline=None, max_examples=1000, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))

# The servers the tests start, in process or as processes, and `create_task` share one operator token.
os.environ.setdefault("DPCDF_ADMIN_TOKEN", secrets.token_urlsafe(32))

import pytest

from fss import backend as _backend


@pytest.fixture(scope="module", params=_backend.available())
def each_backend(request):
    """Runs a test module once per backend this CPU has (portable, and of aarch64, aesni, vaes256, vaes
    those it can run): they must agree."""
    with _backend.using(request.param):
        yield request.param


def pytest_configure(config):
    """With xdist workers (the README's command), compile the kernels once, before the workers start:
    from a clean clone each worker and each server process they start (servers warm up in the
    background) would otherwise compile the same kernels at the same time on CI's two cores.
    `dpcdf warm-up` is the user's own command; its own test checks what it says."""
    import subprocess
    import sys

    workers = getattr(config.option, "numprocesses", None)
    if hasattr(config, "workerinput") or not workers:
        return
    config.option.loadscopereorder = False  # xdist's default (most tests first) ignores LONGEST_FIRST below
    subprocess.run([sys.executable, "-m", "dpcdf", "warm-up"], capture_output=True, timeout=900)


# The longest modules, longest first (seconds in a clean-clone run, numba's compiles of the other
# tiers included), then the rest in file order: with xdist a module's tests stay on one worker, and
# a long one handed out last leaves the other worker idle at the end (xdist's own order, modules
# with the most tests first, handed the one-test fuzzing modules out last: 188 s of one worker alone
# in a clean-clone run). Only the order changes; within a module it is the file's.
LONGEST_FIRST = ("service/test_fuzz_schema.py", "service/test_cli_errors.py", "service/test_fuzz_bodies.py",
                 "fss_tests/test_eval_grid.py", "test_examples.py", "service/system/test_two_servers.py",
                 "service/system/test_round_one_on_servers.py", "service/system/test_adaptive_tasks.py",
                 "service/test_cli_resume.py", "fss_tests/test_exhaustive.py", "service/system/test_dask.py",
                 "fss_tests/test_backend.py", "fss_tests/test_properties.py", "service/system/test_zcdp_tasks.py",
                 "service/system/test_check_exchange.py", "fss_tests/test_coldstart.py", "service/system/test_stalls.py",
                 "service/system/test_zcdp_app_tasks.py", "release/test_mechanisms.py", "release/test_noise.py")


def pytest_collection_modifyitems(items):
    rank = {name: k for k, name in enumerate(LONGEST_FIRST)}

    def key(item):
        path = item.path.as_posix()
        return next((k for name, k in rank.items() if path.endswith("tests/" + name)), len(rank))

    items.sort(key=key)  # stable: the file order within each module and among the rest
