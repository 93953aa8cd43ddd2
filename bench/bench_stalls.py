"""Does one request stall the server? Latency of small requests on other tasks while one slow
operation runs, on real server processes on loopback (issue 11).

    python bench/bench_stalls.py [--reports 10000] [--rounds 3]

Slow operations, each in a background thread against server 0:
  big query   task A (tree, 2^16 grid, --reports reports, closed): --rounds prefix queries of all
              65,536 indices (the largest a request may ask), one after the other;
  2^20 tree   registering a tree task on a 2^20 grid and its first use (GET /tasks/{id}), --rounds
              fresh tasks one after the other.
Probes on server 0 meanwhile, each in a thread of its own, one request after another: GET /health,
one report uploaded to open task C, and a one-index prefix query on closed task B (another analyst). The table gives each probe's
median and worst latency, and how long the slow operation took. The "before" numbers come from the
same script with PYTHONPATH pointing at a checkout of the earlier commit.

Measured on 2 shared, busy cores (load 2-4 from other jobs; 10,000 reports in A), before = afd632f
(one server-wide answer lock, task state built under the table lock, tree plan ~2.3 s per parse):

    while (before)                op s   health p50/max s  upload p50/max s  small query p50/max s
    A: 65,536-index query x3      6.59     0.006 / 0.024     0.008 / 0.029      2.241 / 2.326
    register+use 2^20 tree x3    10.62     0.003 / 0.012     0.009 / 2.248      0.010 / 2.262
    while (after)
    A: 65,536-index query x3      9.44     0.012 / 0.159     0.016 / 0.236      0.022 / 0.305
    register+use 2^20 tree x3     0.06     0.004 / 0.004     0.005 / 0.005      0.007 / 0.007

B's small queries no longer wait for A's (p50 2.24 s -> 0.02 s); A's queries take longer while B's
are answered alongside (they share the 2 cores and the GIL). A 2^20 tree task's registration and
first use: 3.5 s each -> 20 ms, and nothing else waits for it.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_server import direct_insert  # noqa: E402

from dpcdf.analyst import Analyst  # noqa: E402
from dpcdf.service.client import create_task, make_reports  # noqa: E402
from dpcdf.service.http import http  # noqa: E402
from dpcdf.service.processes import start_server, stop  # noqa: E402
from dpcdf.service.task import TaskConfig, token_hash  # noqa: E402

GRID16 = {"kind": "uniform", "lo": 0.0, "hi": 1.0, "bits": 16}
GRID20 = {"kind": "uniform", "lo": 0.0, "hi": 1.0, "bits": 20}
OCTETS = "application/octet-stream"


def timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def probe_while(slow, probes: dict) -> tuple[float, dict[str, list[float]]]:
    """Runs `slow` in a thread and each probe in a thread of its own, one request after another,
    until `slow` ends: (its duration, each probe's latencies)."""
    times = {name: [] for name in probes}
    took = []
    done = threading.Event()

    def run() -> None:
        try:
            took.append(timed(slow))
        finally:
            done.set()

    def loop(name: str) -> None:
        while True:  # at least one request, even if the slow one ends first
            times[name].append(timed(probes[name]))
            if done.is_set():
                return
            time.sleep(0.05)

    thread = threading.Thread(target=run)
    thread.start()
    time.sleep(0.1)  # the slow request is in the server
    loops = [threading.Thread(target=loop, args=(name,)) for name in probes]
    for t in loops:
        t.start()
    for t in (thread, *loops):
        t.join()
    if not took:
        raise RuntimeError("the slow operation failed")
    return took[0], times


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reports", type=int, default=10_000)
    ap.add_argument("--rounds", type=int, default=3, help="2^20 tree tasks registered and used one after the other")
    ap.add_argument("--label", default="", help="a name for this run in the table")
    args = ap.parse_args()
    import dpcdf
    print(f"dpcdf from {Path(dpcdf.__file__).parent}, {os.cpu_count()} cores")
    with tempfile.TemporaryDirectory(prefix="dpcdf-stalls-") as tmp:
        dirs = [f"{tmp}/s0", f"{tmp}/s1"]
        procs = [start_server(p, dirs[p]) for p in (0, 1)]
        urls = [u for _, u in procs]
        s0 = urls[0]
        try:
            while not all(http("GET", f"{u}/health")["warm"] for u in urls):
                time.sleep(0.2)
            # A: the big one; B: small queries by another analyst; C: open for uploads
            a_cfg, a_tok = create_task(urls, GRID16, 1.0, "tree", "substitution", min_batch=1)
            direct_insert(a_cfg, dirs, args.reports)
            Analyst(a_cfg, a_tok).close()
            b_cfg, b_tok = create_task(urls, GRID16, 1.0, "tree", "substitution", min_batch=1)
            direct_insert(b_cfg, dirs, 1000)
            Analyst(b_cfg, b_tok).close()
            c_cfg, _ = create_task(urls, GRID16, 1.0, "tree", "substitution", min_batch=1)
            uploads = iter([r.to_bytes() for r in make_reports(c_cfg, np.random.default_rng(1).uniform(0, 1, 3000))])
            small = json.dumps({"kind": "prefix", "indices": [40000]}).encode()
            big = json.dumps({"kind": "prefix", "indices": list(range(1 << 16))}).encode()
            http("POST", f"{s0}/tasks/{b_cfg.task_id}/query", small, b_tok)  # B's keys loaded
            http("POST", f"{s0}/tasks/{a_cfg.task_id}/query", small, a_tok)  # A's keys loaded
            probes = {
                "health": lambda: http("GET", f"{s0}/health"),
                "upload": lambda: http("POST", f"{s0}/tasks/{c_cfg.task_id}/reports", next(uploads), content_type=OCTETS),
                "small query": lambda: http("POST", f"{s0}/tasks/{b_cfg.task_id}/query", small, b_tok),
            }
            keys = [http("GET", f"{u}/hpke")["keys"]["x25519"] for u in urls]
            admin = os.environ["DPCDF_ADMIN_TOKEN"]
            fresh = [TaskConfig(GRID20, 1.0, "tree", "substitution", 1, (urls[0], urls[1]), (keys[0], keys[1]),
                                token_hash("t"), task_id=f"big-tree-{i}") for i in range(args.rounds)]

            def big_queries() -> None:
                for _ in range(args.rounds):
                    http("POST", f"{s0}/tasks/{a_cfg.task_id}/query", big, a_tok)

            def register_and_use() -> None:
                for cfg in fresh:
                    http("POST", f"{s0}/tasks", cfg.to_json().encode(), admin)
                    http("GET", f"{s0}/tasks/{cfg.task_id}", token="t")

            rows = [("idle", 0.0, {name: [timed(p) for _ in range(20)] for name, p in probes.items()})]
            alone = timed(big_queries)
            print(f"A's {args.rounds} largest queries alone: {alone:.2f} s")
            rows.append((f"A: 65,536-index query x{args.rounds}", *probe_while(big_queries, probes)))
            rows.append((f"register+use 2^20 tree x{args.rounds}", *probe_while(register_and_use, probes)))
        finally:
            for proc, _ in procs:
                stop(proc)
    head = f"{'while (' + args.label + ')':<34} {'op s':>7}" + "".join(f" {n + ' p50/max s':>22}" for n in probes)
    print(head)
    for name, took, times in rows:
        cells = "".join(f" {statistics.median(times[n]):>10.3f} /{max(times[n]):>9.3f}" for n in probes)
        print(f"{name:<34} {took:>7.2f}{cells}")


if __name__ == "__main__":
    main()
