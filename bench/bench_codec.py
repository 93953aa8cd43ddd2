"""Speed of the batch codec (`KeyBatch.to_bytes`, `fss.load_batch`, `fss.write_batch`, `fss.read_batch`)
against `gen_batch` of the same keys, on this CPU's auto tier, one core, CPU time (`time.process_time`,
the best of --reps runs after a warm-up, the operations taking turns).

    python bench/bench_codec.py          # --quick: 100,000 keys instead of 10^6

Columns: gen s: `gen_batch` of n key pairs; to_bytes and load: one party's batch to its bytes and
back (`fss.load_batch`; GB/s: the batch's bytes over the time); write and read: `write_batch` to a file
in --dir (the page cache: no fsync) and `read_batch` of its path (mapped, parsed where it lies); x gen:
(to_bytes + load) / gen. The last line times the numpy codec that batches used before
(`fss.codec.encode_batch` of `KeyBatch.logical()`, and `KeyBatch.from_logical` of `decode_batch`; still
the single-key path) on the first row's keys, best of 2, and its ratio to to_bytes and load_batch.
"""
from __future__ import annotations

import argparse
import os
import platform
import tempfile
import time

import numpy as np

import fss
from fss import DCF, backend, codec


def best_of(fns, reps: int) -> list[float]:
    """The best CPU time of each function over `reps` rounds, the functions taking turns in each round
    (so that a busy spell of the shared machine hits them alike), after one warm-up call each."""
    for fn in fns:
        fn()
    best = [float("inf")] * len(fns)
    for _ in range(reps):
        for i, fn in enumerate(fns):
            t = time.process_time()
            fn()
            best[i] = min(best[i], time.process_time() - t)
    return best


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), platform.machine())
    except OSError:
        return platform.machine()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="100,000 keys instead of 10^6")
    ap.add_argument("--reps", type=int, default=5, help="runs per measurement (best of)")
    ap.add_argument("--dir", default=None, help="where write_batch writes its file (default: a temporary directory)")
    args = ap.parse_args()
    n = 100_000 if args.quick else 1_000_000
    before = backend.threads()
    backend.set_threads(1)
    rng = np.random.default_rng(0)
    alphas = rng.integers(0, 1 << 32, n, dtype=np.uint64)
    print(f"CPU: {cpu_name()}; tier {backend.current()}, one core, CPU time, n = {n} keys, best of {args.reps}")
    head = f"{'function':<54} {'key B':>5} {'MB':>5} | {'gen s':>6} | {'to_bytes s':>10} {'GB/s':>5} | {'load s':>6} {'GB/s':>5} | {'write s':>7} {'read s':>6} | {'x gen':>5}"
    print(head)
    print("-" * len(head))
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        path = os.path.join(tmp, "keys.bin")
        first = None
        for fn in (DCF(32, 64), DCF(32, 32), DCF(32, width=2, group="p61")):
            keys = {}

            def gen(fn=fn):
                keys["k0"] = fn.gen_batch(alphas, 1)[0]

            def to_bytes():
                keys["data"] = keys["k0"].to_bytes()

            def load():
                keys["back"] = fss.load_batch(keys["data"]).key

            def write():
                fss.write_batch(keys["k0"], path)

            def read():
                keys["read"] = fss.read_batch(path).key

            t_gen, t_to, t_load, t_write, t_read = best_of([gen, to_bytes, load, write, read], args.reps)
            assert keys["read"].to_bytes() == keys["back"].to_bytes() == keys["data"]
            size = len(keys["data"])
            print(f"{repr(fn):<54} {fn.key_size:>5} {size / 1e6:>5.0f} | {t_gen:>6.3f} | {t_to:>10.3f} {size / t_to / 1e9:>5.2f} | "
                  f"{t_load:>6.3f} {size / t_load / 1e9:>5.2f} | {t_write:>7.3f} {t_read:>6.3f} | {(t_to + t_load) / t_gen:>5.2f}", flush=True)
            if first is None:
                first = (fn, keys["k0"], t_to, t_load)
            keys.clear()
    fn, k0, t_to, t_load = first
    keys = {}

    def old_to_bytes():
        keys["data"] = codec.encode_batch(fn.params, 0, k0.logical())

    def old_from_bytes():
        fss.KeyBatch.from_logical(fn.params, *codec.decode_batch(fn.params, keys["data"]))

    t_old_to, t_old_from = best_of([old_to_bytes, old_from_bytes], 2)
    print(f"numpy codec (the batch path before), {fn!r}, best of 2: to_bytes {t_old_to:.3f} s ({t_old_to / t_to:.1f}x), "
          f"from_bytes {t_old_from:.3f} s ({t_old_from / t_load:.1f}x)")
    backend.set_threads(before)


if __name__ == "__main__":
    main()
