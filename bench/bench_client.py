"""The client's cost per report against the floor its crypto sets: two HPKE seals.

    python bench/bench_client.py [--n 2000] [--repeat 3]

`make_reports` (grid index, DCF key pair, each key serialized and HPKE-sealed to its server under a
fresh report id) is timed per report for count tasks, unverified and verified (the verified share
carries the check's extra field elements), and for a label task; in the same run, on the same core,
the two seals alone (pyca/cryptography's HPKE, the same suite, key and share sizes). Best of
`--repeat` rounds (CPU time, the two taking turns); one thread (OpenSSL and numba here use one core). No server is needed: the task
config names two throwaway HPKE public keys.
"""
from __future__ import annotations

import argparse
import platform
import secrets
import time

import numpy as np

from dpcdf.service import hpke
from dpcdf.service.client import make_reports
from dpcdf.service.task import TaskConfig, token_hash
from dpcdf.service.wire import hpke_info


def cpu_name() -> str:
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def config(bits: int, payload: str, verify: bool, kem: str = "x25519") -> TaskConfig:
    from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
    from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

    keys = [X25519PrivateKey.generate().public_key().public_bytes(Encoding.Raw, PublicFormat.Raw).hex() for _ in (0, 1)]
    grid = {"kind": "uniform", "lo": 0.0, "hi": 1.0, "bits": bits}
    return TaskConfig(grid, 1.0, "tree", "substitution", 1, ("http://127.0.0.1:1", "http://127.0.0.1:2"),
                      (keys[0], keys[1]), token_hash("t"), payload=payload, kem=kem, verify=verify)


def best_of_interleaved(fns, repeat: int) -> list[float]:
    """The least CPU time (this process, one thread) of each function over `repeat` rounds, the
    functions taking turns within a round, so that a busy machine slows them alike."""
    times = [[] for _ in fns]
    for _ in range(repeat):
        for k, fn in enumerate(fns):
            t = time.process_time()
            fn()
            times[k].append(time.process_time() - t)
    return [min(t) for t in times]


def seals_only(cfg: TaskConfig, n: int, share_len: int) -> None:
    """The floor: two seals per report of `share_len`-byte shares, nothing else."""
    suite = hpke.suite(cfg.kem)
    pks = [hpke.public_key(cfg.kem, h) for h in cfg.hpke_keys]
    share, fp = secrets.token_bytes(share_len), cfg.fingerprint  # (the fingerprint is computed per access)
    for _ in range(n):
        rid = secrets.token_bytes(16)
        for party in (0, 1):
            suite.encrypt(share, pks[party], info=hpke_info(fp, rid, party))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=2000, help="reports per timed run (default 2000)")
    ap.add_argument("--repeat", type=int, default=5, help="timed rounds; the best is shown (default 5)")
    args = ap.parse_args()
    from fss import backend

    backend.set_threads(1)  # one core: the kernels' thread pool too
    print(f"CPU: {cpu_name()}, fss tier {backend.current()}; one core, CPU time; n = {args.n} reports per run, best of {args.repeat}\n")
    print(f"{'task':<34} {'make_reports us':>15} {'2 seals us':>10} {'ratio':>6} {'reports/s':>10}")
    rng = np.random.default_rng(0)  # the simulated values only
    for name, bits, payload, verify in (("count, 2^10 grid, unverified", 10, "count", False),
                                        ("count, 2^10 grid, verified", 10, "count", True),
                                        ("count, 2^16 grid, verified", 16, "count", True),
                                        ("count, 2^20 grid, unverified", 20, "count", False),
                                        ("label, 2^10 grid, unverified", 10, "label", False)):
        cfg = config(bits, payload, verify)
        vals = rng.uniform(0, 1, args.n)
        labels = rng.integers(0, 2, args.n) if payload == "label" else None
        make_reports(cfg, vals[:50], None if labels is None else labels[:50])  # compile/load the kernels
        share_len = len(make_reports(cfg, vals[:1], None if labels is None else labels[:1])[0].sealed[0][1]) - 16
        made, seals = (t / args.n * 1e6 for t in best_of_interleaved(
            [lambda: make_reports(cfg, vals, labels), lambda: seals_only(cfg, args.n, share_len)], args.repeat))
        print(f"{name:<34} {made:>15.1f} {seals:>10.1f} {made / seals:>6.2f} {1e6 / made:>10.0f}")


if __name__ == "__main__":
    main()
