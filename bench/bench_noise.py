"""A server's own noise on prefix queries: the time to derive the PRF noise of every node a prefix
sums (path: its L + 1 path nodes; tree: its covering nodes), for many indices at once.

    python bench/bench_noise.py [--bits 16] [--counts 1000 65536]

Measured through `Aggregator.prefix_shares` on a task without reports, so only the noise is timed
(the DCF evaluation of the key shares is bench_server.py's business). Prints one row per
mechanism and number of indices: seconds, and microseconds per index.
"""
from __future__ import annotations

import argparse
import time

import numpy as np

from dpcdf.release.mechanisms import PathMechanism, TreeMechanism
from dpcdf.service.server.aggregate import Aggregator
from fss import DCF


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bits", type=int, default=16)
    ap.add_argument("--counts", type=int, nargs="+", default=[1000, 65536])
    ap.add_argument("--epsilon", type=float, default=1.0)
    args = ap.parse_args()
    size = 1 << args.bits
    dcf = DCF(args.bits, 64, 1, cmp="ge")
    rng = np.random.default_rng(0)
    print(f"grid of 2^{args.bits} points, epsilon {args.epsilon:g}, substitution")
    print(f"{'mechanism':<24}{'indices':>10}{'seconds':>10}{'us/index':>10}")
    for mech in (PathMechanism(size, args.epsilon), TreeMechanism(size, args.epsilon)):
        agg = Aggregator(dcf, mech, b"\x07" * 32, "bench-noise")
        label = f"{mech.name} (b={mech.shape.branching}, h={mech.shape.height})"
        for count in args.counts:
            idx = rng.choice(size, count, replace=False) if count <= size else rng.integers(0, size, count)
            agg.prefix_shares([], idx[:8])  # warm the numba kernels
            t0 = time.perf_counter()
            agg.prefix_shares([], idx)
            dt = time.perf_counter() - t0
            print(f"{label:<24}{count:>10}{dt:>10.3f}{dt / count * 1e6:>10.1f}")


if __name__ == "__main__":
    main()
