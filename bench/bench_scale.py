"""Scaling a server's evaluation: in-process vs Dask (`--dask local:1`, `local:2`), up to 10^7 reports.

    python bench/bench_scale.py [--sizes 100000 1000000 10000000] [--max-n N] [--scatter-max N]

For each n, one server's key shares for a 2^10 grid (DCF bits=10, 64-bit payloads, as a task's
reports would carry) are generated in chunks of 2^20 (`DCF.gen_batch`) and written straight into a
store and its segments (no HTTP, no HPKE: the reports' path is measured by bench_server.py and
bench_faults.py), the task marked reconciled. Then, for each mode, a fresh process does what a
server does at its first query: `segments.open_or_build` (map the segments, verify their SHA-256:
"load s"), and answers full-grid prefix queries (1024 points; "first q s" includes the workers'
first mapping of the files, "query s" is the next one). "peak MiB" is the largest peak RSS of an
evaluating process (the server process in-process, else each Dask worker): it counts the mapped
segment pages a process touched, which are the page cache's, shared between processes, not copies.
"write s" is the segment write (files fsynced, SHA-256 computed while writing), "gen s" the key
generation that precedes it. local:2+scatter sends each piece to a worker once (`Client.scatter`)
instead of naming the files: "first q s" includes the sending.

`--verified` runs the verified column instead (issue 24, bench/bench_scale_verified.py): round one of a
verified task, in-process and on a LocalCluster of 1 and 2 workers.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import sqlite3
import subprocess
import sys
import tempfile
import time

import numpy as np

BITS, GRID = 10, 1024
TASK = "bench"
MODES = ("in-process", "local:1", "local:2", "local:2+scatter")


def _dcf():
    from fss import DCF

    return DCF(bits=BITS, out_bits=64, cmp="ge")


def prepare(data_dir: str, n: int) -> tuple[float, float]:
    """A reconciled task of n reports in data_dir's store, its party-0 key shares in segments; (gen s, write s)."""
    from dpcdf.service.storage import segments
    from dpcdf.service.storage.store import Store

    store = Store(os.path.join(data_dir, "server.sqlite"))
    store.add_task(TASK, "{}", b"bench", b"\0" * 32)
    store.close()
    db = sqlite3.connect(os.path.join(data_dir, "server.sqlite"))  # as if n reports had been closed and reconciled
    db.execute("UPDATE tasks SET frozen_seq = ?, report_count = ?, set_hash = 'bench', closed_at = 0, reconciled_at = 0 "
               "WHERE task_id = ?", (n, n, TASK))
    db.commit()
    db.close()
    dcf, rng, gen = _dcf(), np.random.default_rng(n), [0.0]

    def batches():
        for start in range(0, n, segments.SHARD_KEYS):
            t = time.perf_counter()
            k0, _ = dcf.gen_batch(rng.integers(0, GRID, min(segments.SHARD_KEYS, n - start)), 1)
            gen[0] += time.perf_counter() - t
            yield k0

    store = Store(os.path.join(data_dir, "server.sqlite"))
    t = time.perf_counter()
    files = segments.write(segments.task_dir(data_dir, TASK), batches(), "bench")
    store.record_segments(TASK, files)
    total = time.perf_counter() - t
    store.close()
    return gen[0], total - gen[0]


def child(data_dir: str, mode: str) -> dict:
    """One server process's first load and full-grid queries in `mode`."""
    from dpcdf.release.mechanisms import PathMechanism
    from dpcdf.service.storage import segments
    from dpcdf.service.server.aggregate import Aggregator
    from dpcdf.service.storage.store import Store

    dcf = _dcf()
    store = Store(os.path.join(data_dir, "server.sqlite"))
    evaluator = None
    if mode != "in-process":
        from dpcdf.service.server.dask_eval import DaskEvaluator

        address, _, transport = mode.partition("+")
        evaluator = DaskEvaluator(address, transport or "path")
    try:
        dcf.eval_sum(dcf.gen_batch(np.arange(16), 1)[0], np.arange(GRID))  # kernels loaded: time the work
        t = time.perf_counter()
        shards = segments.open_or_build(store, TASK, dcf, 0, data_dir)
        load = time.perf_counter() - t
        agg = Aggregator(dcf, PathMechanism(GRID, 1.0, "substitution"), b"\1" * 32, TASK, evaluator=evaluator)
        grid = np.arange(GRID)
        t = time.perf_counter()
        first = agg.prefix_shares(shards, grid)
        first_q = time.perf_counter() - t
        t = time.perf_counter()
        again = agg.prefix_shares(shards, grid)
        query = time.perf_counter() - t
        assert np.array_equal(first, again)
        if evaluator is None:
            peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        else:
            peak = max(evaluator.client.run(lambda: resource.getrusage(resource.RUSAGE_SELF).ru_maxrss).values())
        digest = int(np.bitwise_xor.reduce(first))
    finally:
        if evaluator is not None:
            evaluator.close()
        store.close()
    return {"load": load, "first": first_q, "query": query, "peak_mib": peak / 1024, "digest": digest}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", nargs="*", type=int, default=[100_000, 1_000_000, 10_000_000])
    ap.add_argument("--max-n", type=int, default=None, help="skip sizes above this")
    ap.add_argument("--scatter-max", type=int, default=1_000_000, help="run local:2+scatter up to this n")
    ap.add_argument("--verified", nargs="*", metavar="BITS:N", help="the verified column instead: round one of a "
                    "verified task in-process and on local:1, local:2 (bench/bench_scale_verified.py --runs BITS:N ...)")
    ap.add_argument("--child", nargs=2, metavar=("DATA", "MODE"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(*args.child)))
        return
    if args.verified is not None:
        import bench_scale_verified  # this script's directory is on sys.path

        bench_scale_verified.main(["--runs", *args.verified] if args.verified else [])
        return
    sizes = [n for n in args.sizes if args.max_n is None or n <= args.max_n]
    print(f"{'n':>9} {'mode':>16} {'gen s':>6} {'write s':>7} {'load s':>6} {'first q s':>9} {'query s':>7} {'peak MiB':>8} {'1->2 workers':>12}")  # noqa: E501
    for n in sizes:
        with tempfile.TemporaryDirectory(prefix="dpcdf-scale-") as tmp:
            gen, write = prepare(tmp, n)
            results = {}
            for mode in MODES:
                if mode.endswith("scatter") and n > args.scatter_max:
                    continue
                out = subprocess.run([sys.executable, __file__, "--child", tmp, mode], check=True,
                                     capture_output=True, text=True).stdout
                r = results[mode] = json.loads(out.strip().splitlines()[-1])
                if r["digest"] != results["in-process"]["digest"]:
                    raise SystemExit(f"{mode} gave other shares than in-process at n={n}")
                speedup = f"{results['local:1']['query'] / r['query']:.2f}x" if mode == "local:2" else ""
                w = f"{write:.2f}" if mode == "in-process" else ""
                g = f"{gen:.2f}" if mode == "in-process" else ""
                print(f"{n:>9} {mode:>16} {g:>6} {w:>7} {r['load']:>6.2f} {r['first']:>9.2f} {r['query']:>7.2f} "
                      f"{r['peak_mib']:>8.0f} {speedup:>12}", flush=True)


if __name__ == "__main__":
    main()
