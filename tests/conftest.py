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
    subprocess.run([sys.executable, "-m", "dpcdf", "warm-up"], capture_output=True, timeout=900)


# The longest modules (minutes of the suite, measured in clean-clone runs), run first: with xdist a
# module's tests stay on one worker, and one of these collected last left the other worker idle
# for a minute or two at the end. Only the order changes; within a module it is the file's.
LONGEST_FIRST = ("service/test_fuzz_schema.py", "service/test_fuzz_bodies.py", "service/test_cli_errors.py",
                 "service/system/test_two_servers.py", "service/test_verify.py", "test_examples.py", "service/test_cli_resume.py",
                 "apps/test_hosmer_lemeshow_direct.py", "service/system/test_dask.py")


def pytest_collection_modifyitems(items):
    items.sort(key=lambda item: 0 if item.path.as_posix().endswith(LONGEST_FIRST) else 1)
