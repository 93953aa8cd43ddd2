"""The kernels as LLVM compiles them for an older x86-64 CPU than this one (`scripts/older_cpu.py`):
the `vaes256` and `aesni` tiers of an AVX2 CPU without AVX-512 (Zen 3, Alder Lake) on an AVX-512
machine, and the `aesni` tier's legacy SSE encodings (Westmere, Goldmont: AES-NI without AVX) on any
machine with AVX. Otherwise a test run covers only the code made for the machine it runs on.

Each profile runs the kernel-equivalence tests (every fused kernel against the portable backend, the
known-answer vectors on every tier, eval_grid and its sums on every tier) in a fresh process, whose
kernels numba compiles for that CPU; every instruction of that code also runs here."""
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("older_cpu", ROOT / "scripts" / "older_cpu.py")
older_cpu = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(older_cpu)

VECTORS = ["tests/fss_tests/test_vectors.py", "tests/fss_tests/test_eval_grid.py::test_every_backend_equals_portable"]
EQUIVALENCE = {  # avx2: every fused kernel of two tiers; sse: one tier's inline AES blocks, through each kind of kernel
    "avx2": VECTORS + ["tests/fss_tests/test_backend.py",
                       "tests/fss_tests/test_eval_grid.py::test_eval_grid_sums_equals_the_sums_of_eval_grid"],
    "sse": VECTORS + ["tests/fss_tests/test_backend.py::test_thread_count_does_not_change_sums"],
}


def _env(profile: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("FSS_BACKEND", "PYTEST_XDIST_WORKER", "PYTEST_ADDOPTS")}
    env.update(older_cpu.environment(profile))
    return env


def test_profiles_switch_off_only_newer_features():
    host = {"aes": True, "avx": True, "avx2": True, "vaes": True, "vpclmulqdq": True, "avx512f": True,
            "avx512vl": True, "gfni": True, "sse4.2": True, "fma": True, "sha": False}
    assert older_cpu.runnable(host, "x86_64") == ["avx2", "aesni", "sse"]
    assert older_cpu.runnable(host, "aarch64") == []
    flags = {p: dict((f[1:], f[0] == "+") for f in older_cpu.environment(p, host)["NUMBA_CPU_FEATURES"].split(","))
             for p in older_cpu.PROFILES}
    assert flags["avx2"] == dict(host, avx512f=False, avx512vl=False, gfni=False)
    assert flags["aesni"] == dict(flags["avx2"], vaes=False, vpclmulqdq=False)
    assert flags["sse"] == dict(flags["aesni"], avx=False, avx2=False, fma=False)
    zen3 = dict(host, avx512f=False, avx512vl=False, gfni=False)  # its own code is the avx2 profile's
    assert older_cpu.runnable(zen3, "x86_64") == ["aesni", "sse"]
    assert older_cpu.runnable(dict(zen3, aes=False), "x86_64") == []
    with pytest.raises(ValueError):
        older_cpu.environment("avx512", host)


@pytest.mark.parametrize("profile", ["avx2", "sse"])
def test_kernels_compiled_for_an_older_cpu_equal_the_portable_backend(profile):
    if profile not in older_cpu.runnable():
        pytest.skip(f"this CPU cannot run the {profile} profile's code or has nothing newer (scripts/older_cpu.py)")
    env = _env(profile)
    tiers = subprocess.run([sys.executable, "-c", "import fss.backend as b; print(','.join(b.available()))"],
                           env=env, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert tiers.returncode == 0, tiers.stderr
    assert tuple(tiers.stdout.strip().split(",")) == older_cpu.expected_tiers(profile)
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "-p", "no:xdist", *EQUIVALENCE[profile]],
                         env=env, cwd=ROOT, capture_output=True, text=True, timeout=1200)
    tail = run.stdout[-3000:] + run.stderr[-2000:]
    assert run.returncode == 0, tail
    assert " passed" in run.stdout and "failed" not in run.stdout, tail
