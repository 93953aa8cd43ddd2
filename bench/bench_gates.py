"""Speed of the gates on masked inputs (`fss.gates`) against the plain DCF they are built on, on this
CPU's auto tier, one core, CPU time (`time.process_time`, the best of --reps runs after a warm-up).

    python bench/bench_gates.py          # --quick for a smaller run

Rows: the plain DCF of 32 bits (x < alpha, payload 1) in the output group, then each gate over the same
domain and group. gen: key pairs/s of `gen_batch` (the DCF's gen, plus the mask shares); eval: one
party's outputs/s of `eval_batch` at one masked input per key (two DCF evaluations and the public
correction). "x DCF" divides by the plain DCF's rate in the same group: a comparison or interval costs
one DCF key and two evaluations, ReLU one width-2 DCF key and two evaluations.
"""
from __future__ import annotations

import argparse
import os

import numpy as np

from fss import DCF, ComparisonGate, IntervalGate, ReluGate, backend

from bench_codec import best_of, cpu_name  # one timer and one CPU name for the fss benches beside it (run from bench/)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="20,000 keys instead of 100,000")
    ap.add_argument("--reps", type=int, default=5, help="runs per measurement (best of)")
    args = ap.parse_args()
    n = 20_000 if args.quick else 100_000
    before = backend.threads()
    backend.set_threads(1)
    rng = np.random.default_rng(0)  # public inputs only (x_hat, the baseline's thresholds): masks come from random_masks (CSPRNG)
    x_hat = rng.integers(0, 1 << 32, n, dtype=np.uint64)
    print(f"CPU: {cpu_name()}; tier {backend.current()}, one core, CPU time, n = {n} keys, best of {args.reps}")
    head = f"{'function':<62} {'key B':>6} | {'gen M/s':>7} {'x DCF':>6} | {'eval M/s':>8} {'x DCF':>6}"
    print(head)
    print("-" * len(head))
    for group in ("ring", "p61"):
        kw = dict(out_bits=32) if group == "ring" else dict(group="p61")
        plain = DCF(32, **kw)
        alphas = rng.integers(0, 1 << 32, n, dtype=np.uint64)
        keys, _ = plain.gen_batch(alphas, 1)
        gates = (ComparisonGate(32, 1000, **kw), IntervalGate(32, 1000, 5000, **kw), ReluGate(32, **kw))
        masks = [g.random_masks(n) for g in gates]
        gate_keys = [g.gen_batch(*m)[0] for g, m in zip(gates, masks)]
        gens = best_of([lambda: plain.gen_batch(alphas, 1)] + [lambda g=g, m=m: g.gen_batch(*m) for g, m in zip(gates, masks)],
                       args.reps)
        evals = best_of([lambda: plain.eval_batch(keys, x_hat)] + [lambda g=g, k=k: g.eval_batch(k, x_hat)
                                                                  for g, k in zip(gates, gate_keys)], args.reps)
        for i, fn in enumerate((plain, *gates)):
            name = ("plain " if i == 0 else "") + repr(fn)
            gen, ev = n / gens[i], n / evals[i]
            print(f"{name:<62} {fn.key_size if i == 0 else fn.dcf.key_size:>6} | {gen / 1e6:>7.3f} {gens[0] / gens[i]:>6.2f} | "
                  f"{ev / 1e6:>8.3f} {evals[0] / evals[i]:>6.2f}", flush=True)
    backend.set_threads(before)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    main()
