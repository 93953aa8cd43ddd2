"""The servers' speed: report ingest and query latency, on real server processes on loopback.

    python bench/bench_server.py [--sizes 10000 100000 1000000] [--bits 10] [--close-only]

Unverified tasks (`verify=False`) on a grid of 2^--bits points; docs/verification.md measures verified ones.
Ingest: reports sealed beforehand (client work not counted), uploaded in batches of 1000 to one
server; each report is parsed, HPKE-opened, checked to be a key of the task, and committed to SQLite
before the acknowledgement. For the sizes, n - 1 reports' key shares are written into the servers'
databases directly (as if ingested), since sealing a million reports on the client would take far
longer than what is measured, and the last report is uploaded to both servers (`submit`): as any
upload, it wakes each server's background work on the task's stored reports, and "collect s" is the
time until neither server has any left (/health/operator `checking`; what runs while reports arrive).
"close s" is the analyst's close: both servers freeze and reconcile their sets, each writes its key
shares into segments (server 1 as its reconciliation ends, server 0 after) and, on grids of up to
2^16 points, stores its histogram share. Queries: the analyst's latency (both servers, shares added)
for "first q s" (the first query after the close, 1024 thresholds spread over the grid), then the
best of 3 of 1 threshold and of 2 of the 1024 thresholds. `--close-only` skips the queries. The
first line names the CPU and the load average before and after the run.
"""
from __future__ import annotations

import argparse
import os
import platform
import sqlite3
import tempfile
import time

import numpy as np

from dpcdf.analyst import Analyst
from dpcdf.service.http import http
from dpcdf.service.client import create_task
from dpcdf.service.client import make_reports, submit
from dpcdf.service.wire import encode_batch
from dpcdf.service.processes import start_server, stop
from dpcdf.service.task import TaskConfig

def direct_insert(config: TaskConfig, data_dirs: list[str], n: int) -> None:
    """n reports' key shares written straight into both servers' stores."""
    dcf = config.dcf()
    alphas = np.random.default_rng(n).integers(0, config.make_grid().size, n)
    k0, k1 = dcf.gen_batch(alphas, 1)
    body_len = dcf.params.body_len
    for party, batch, data_dir in ((0, k0, data_dirs[0]), (1, k1, data_dirs[1])):
        header = dcf.params.header(party)
        bodies = np.frombuffer(batch.to_bytes(), np.uint8, offset=16).reshape(n, body_len)
        db = sqlite3.connect(f"{data_dir}/server.sqlite")
        db.execute("BEGIN")
        db.executemany("INSERT INTO reports (task_id, report_id, key_share, received) VALUES (?, ?, ?, 0)",
                       ((config.task_id, i.to_bytes(16, "little"), header + bodies[i].tobytes()) for i in range(n)))
        db.execute("COMMIT")
        db.close()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", nargs="*", type=int, default=[10_000, 100_000, 1_000_000])
    ap.add_argument("--ingest", type=int, default=5000)
    ap.add_argument("--bits", type=int, default=10, help="the grid has 2^bits points (default 10)")
    ap.add_argument("--close-only", action="store_true", help="time the close only (no ingest run, no queries)")
    args = ap.parse_args()
    grid = {"kind": "uniform", "lo": 0.0, "hi": 1.0, "bits": args.bits}
    load_start = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="dpcdf-bench-") as tmp:
        dirs = [f"{tmp}/s0", f"{tmp}/s1"]
        procs = [start_server(p, dirs[p]) for p in (0, 1)]
        urls = [u for _, u in procs]
        try:
            while not all(http("GET", f"{u}/health")["warm"] for u in urls):  # kernels compiled: measure the work
                time.sleep(0.2)
            # unverified tasks: direct_insert writes bare key shares, which a verified task (the default on a
            # 2^16 grid) would refuse at the close (each of its shares carries the check's extras)
            if args.close_only:
                args.ingest = 0
            config, token = create_task(urls, grid, 1.0, "path", "substitution", min_batch=1, verify=False)
            make_reports(config, [0.5])  # the client's kernels compiled (or loaded) before the clock starts
            if args.ingest:
                t = time.perf_counter()
                reports = [r.to_bytes() for r in make_reports(config, np.random.default_rng(0).uniform(0, 1, args.ingest))]
                seal = time.perf_counter() - t
                t = time.perf_counter()
                for start in range(0, len(reports), 1000):
                    http("POST", f"{urls[0]}/tasks/{config.task_id}/reports/batch", encode_batch(reports[start : start + 1000]),
                         content_type="application/octet-stream")
                ingest = time.perf_counter() - t
            print(f"# {cpu_name()}, {os.cpu_count()} cores; load average {load_start:.1f} at the start")
            if args.ingest:
                print(f"client: {args.ingest / seal:.0f} reports/s made and sealed (both shares), one core")
                print(f"server ingest: {args.ingest / ingest:.0f} reports/s (parse, HPKE open, key check, SQLite commit)\n")
            print(f"# grid 2^{args.bits}")
            print(f"{'n':>9} {'collect s':>9} {'close s':>8} {'first q s':>9} {'1 threshold s':>13} {'1024 thresholds s':>17}")
            size = 1 << args.bits
            spread = np.linspace(0, size - 1, 1024).astype(int)
            for n in args.sizes:
                cfg, tok = create_task(urls, grid, 1.0, "path", "substitution", min_batch=1, verify=False)
                direct_insert(cfg, dirs, n - 1)
                os.sync()  # the inserted rows on disk, so the close's own fsyncs are what it pays for
                collect = _timed(lambda: (submit(cfg, [0.5]), _settle(urls)))
                analyst = Analyst(cfg, tok)
                close = _timed(analyst.close)  # the close and the servers' reconciliation
                if args.close_only:
                    print(f"{n:>9} {collect:>9.2f} {close:>8.2f}")
                    continue
                first = _timed(lambda: analyst.prefix_counts(spread))
                one = min(_timed(lambda: analyst.prefix_counts([size * 5 // 8])) for _ in range(3))
                many = min(_timed(lambda: analyst.prefix_counts(spread)) for _ in range(2))
                print(f"{n:>9} {collect:>9.2f} {close:>8.2f} {first:>9.3f} {one:>13.3f} {many:>17.3f}")
        finally:
            for proc, _ in procs:
                stop(proc)
    print(f"# load average {os.getloadavg()[0]:.1f} at the end")


def cpu_name() -> str:
    """The CPU's model name and its AVX-512 and VAES flags (/proc/cpuinfo), else what platform says."""
    name, flags = platform.processor() or platform.machine(), set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "model name":
                    name = value.strip()
                elif key.strip() == "flags":
                    flags = set(value.split())
                    break
    except OSError:
        pass
    if flags:
        name += ", " + ("AVX-512" if "avx512f" in flags else "no AVX-512") + (", VAES" if "vaes" in flags else "")
    return name


def _settle(urls: list[str]) -> None:
    """Until neither server has background work on reports queued or running (/health/operator)."""
    while any(http("GET", f"{u}/health/operator", token=os.environ["DPCDF_ADMIN_TOKEN"])["checking"] for u in urls):
        time.sleep(0.05)


def _timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


if __name__ == "__main__":
    main()
