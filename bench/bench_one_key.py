"""One key's latency: `gen(alpha)` (a pair) and `eval(key, x)` of DCF(32, 64, x <= alpha) on every
kernel tier this CPU has, against sycret's in the same run (issue 45's goal: at most sycret's time).

    python bench/bench_one_key.py [--quick]

CPU microseconds a call, one core (`best_of` 5 loops of 3,000 calls; --quick 500), each call's result
dropped (a list of 3,000 key pairs would time the garbage collector too); sycret: LeFactory keygen(1)
and eval of one point (`pip install -e '.[bench]'`).
"""
from __future__ import annotations

import argparse

import numpy as np

from bench_fss import best_of, describe_cpu  # one CPU line and one timer for every bench (run from bench/)
from fss import DCF, backend


def one_key_section(quick: bool) -> None:
    """Latency of one key: `gen(alpha)` (a pair) and `eval(key, x)` of DCF(32, 64, x <= alpha), CPU
    microseconds a call (best of 5 loops), against sycret's LeFactory keygen(1) and eval of one point."""
    n = 500 if quick else 3000

    def us(call) -> float:
        def loop() -> None:  # keeps no result (a list of 3000 key pairs would time the garbage collector too)
            for _ in range(n):
                call()

        return best_of(loop, 5) / n * 1e6

    fn = DCF(32, 64, 1, cmp="le")
    print("\none key (DCF(32, 64), x <= alpha, one core): CPU us a call")
    print(f"{'':>16} {'gen us':>8} {'eval us':>8}")
    try:
        import sycret

        le = sycret.LeFactory(n_threads=1)
        ka, _ = le.keygen(1)
        x1 = np.array([999], dtype=np.int64)
        syc = (us(lambda: le.keygen(1)), us(lambda: le.eval(0, x1, ka)))
        print(f"{'sycret':>16} {syc[0]:>8.1f} {syc[1]:>8.1f}")
    except ImportError:
        syc = None
    before = backend.threads()
    backend.set_threads(1)
    for name in reversed(backend.available()):
        with backend.using(name):
            k0, _ = fn.gen(1000, 1)
            ours = (us(lambda: fn.gen(1000, 1)), us(lambda: fn.eval(k0, 999)))
        ratio = "" if syc is None else f"  ({ours[0] / syc[0]:.1f}x, {ours[1] / syc[1]:.1f}x sycret's time)"
        print(f"{'fss ' + name:>16} {ours[0]:>8.1f} {ours[1]:>8.1f}{ratio}")
    backend.set_threads(before)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    print(f"CPU: {describe_cpu()}; tiers {', '.join(backend.available())}")
    one_key_section(args.quick)


if __name__ == "__main__":
    main()
