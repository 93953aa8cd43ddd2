"""Run a command with numba compiling fss's kernels for an older x86-64 CPU than this one.

    python scripts/older_cpu.py avx2 -- python bench/bench_verify.py --skip 1,3
    python scripts/older_cpu.py sse -- python -m pytest -q tests/fss_tests/test_vectors.py
    python scripts/older_cpu.py            # which profiles this CPU can run, and their tiers

A kernel tier is compiled for the CPU numba targets, and LLVM picks other instructions for another
CPU: the `vaes256` tier on an AVX-512 machine may use AVX-512VL forms and 32 registers that a Zen 3
does not have, and the `aesni` tier's inline AES blocks use legacy SSE encodings on a CPU without AVX.
Each profile is this CPU's own feature list (as LLVM reads it) with the newer extensions switched off
and an older CPU's name for LLVM's tuning, passed to numba as NUMBA_CPU_NAME and NUMBA_CPU_FEATURES
(which `fss._aes.host_features` reads too, so `fss.backend` picks that CPU's tiers):

    avx2   AVX2 + 256-bit VAES, no AVX-512   AMD Zen 3 (znver3), Intel Alder Lake   tiers vaes256, aesni
    aesni  AVX2 + AES-NI, no VAES            AMD Zen 2 (znver2), Intel Skylake      tier aesni
    sse    AES-NI without AVX                Intel Westmere, Goldmont (Atom, Celeron, Pentium Silver)

Every instruction of such code also runs on this CPU, so the tests say whether the code LLVM makes
for the older CPU is correct (`tests/fss_tests/test_older_cpu.py` runs the kernel-equivalence tests
so). A benchmark says how fast that code runs on *this* CPU, not on the older one: its cores differ
(on an AMD Zen 4 the avx2 profile's eval_grid drove 43-56% of the tier's AES peak, where a Zen 3
drove 36% with that kind of code; docs/fss.md). Compare two versions of the code under one profile
in the same session; only the older CPU itself measures its speed.
"""
from __future__ import annotations

import os
import sys

PROFILES = ("avx2", "aesni", "sse")
_NAMES = {"avx2": ("znver3", "alderlake"), "aesni": ("znver2", "skylake"), "sse": ("goldmont", "goldmont")}
_TIERS = {"avx2": ("portable", "aesni", "vaes256"), "aesni": ("portable", "aesni"), "sse": ("portable", "aesni")}
_NEEDS = {"avx2": {"aes", "avx2", "vaes"}, "aesni": {"aes", "avx2"}, "sse": {"aes"}}


def _off(profile: str, feature: str) -> bool:
    """Whether `profile` switches this LLVM feature off."""
    if feature.startswith(("avx512", "avx10", "amx")) or feature in ("evex512", "gfni"):
        return True
    if profile in ("aesni", "sse") and feature in ("vaes", "vpclmulqdq"):
        return True
    return profile == "sse" and (feature.startswith("avx") or feature in ("fma", "f16c", "fma4", "xop"))


def _amd() -> bool:
    try:
        with open("/proc/cpuinfo") as f:
            return "AuthenticAMD" in f.read(4096)
    except OSError:
        return False


def host_features() -> dict[str, bool]:
    from llvmlite import binding as llvm

    return dict(llvm.get_host_cpu_features())


def runnable(features: dict[str, bool] | None = None, machine: str | None = None) -> list[str]:
    """The profiles this CPU (or one of these LLVM features and machine name) can run: those whose
    features it has and that differ from its own code (a Zen 3 runs aesni and sse, an AVX-512
    machine all three; none off x86-64)."""
    import platform

    if (machine or platform.machine()).lower() not in ("x86_64", "amd64"):
        return []
    f = host_features() if features is None else features
    on = {k for k, v in f.items() if v}
    return [p for p in PROFILES if _NEEDS[p] <= on and any(_off(p, k) for k in on)]


def environment(profile: str, features: dict[str, bool] | None = None) -> dict[str, str]:
    """NUMBA_CPU_NAME and NUMBA_CPU_FEATURES for `profile` on this CPU."""
    if profile not in PROFILES:
        raise ValueError(f"profile must be one of {PROFILES}, got {profile!r}")
    f = host_features() if features is None else features
    flags = ",".join(("+" if on and not _off(profile, k) else "-") + k for k, on in sorted(f.items()))
    return {"NUMBA_CPU_NAME": _NAMES[profile][0 if _amd() else 1], "NUMBA_CPU_FEATURES": flags}


def expected_tiers(profile: str) -> tuple[str, ...]:
    """The tiers `fss.backend.available()` lists under `profile`, in its order."""
    return _TIERS[profile]


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in PROFILES:
        have = runnable()
        print("usage: python scripts/older_cpu.py PROFILE -- COMMAND ...")
        for p in PROFILES:
            state = "runs here" if p in have else "not on this CPU (it lacks the profile's features or has nothing newer)"
            print(f"  {p:6} tiers {', '.join(_TIERS[p]):27} {state}")
        return 2 if argv else 0
    profile, rest = argv[0], argv[1:]
    if rest[:1] == ["--"]:
        rest = rest[1:]
    if profile not in runnable():
        print(f"older_cpu: this CPU cannot run the {profile} profile's code, or its own code is that code", file=sys.stderr)
        return 2
    if not rest:
        print("older_cpu: no command to run", file=sys.stderr)
        return 2
    env = environment(profile)
    print(f"older_cpu: kernels compiled for {env['NUMBA_CPU_NAME']} ({profile} profile) on this CPU", file=sys.stderr)
    os.environ.update(env)
    os.execvp(rest[0], rest)
    return 0  # not reached


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
