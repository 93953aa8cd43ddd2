"""Ingest under load and faults: concurrent uploaders against both servers while one server is killed
(SIGKILL) and restarted, then every client resumes from its spool, the analyst closes and queries.

    python bench/bench_faults.py [--clients 20] [--seconds 60] [--kills 2] [--victim 1]

Servers run with noise off (the test-only switch) so that the answer can be checked count by count
against the values the clients made. Prints one table: reports made, acknowledged by both servers,
counted after the close, duplicates and lost acknowledged reports (both must be 0), one-sided reports
dropped at the close, the sustained rate per server, and the close's time.
"""
from __future__ import annotations

import argparse
import signal
import sys
import tempfile
import threading
import time

import numpy as np

from dpcdf.analyst import Analyst
from dpcdf.release.ecdf import prefix_counts
from dpcdf.service.client import UploadIncomplete, create_task, submit
from dpcdf.service.http import ServerError, http
from dpcdf.service.processes import free_port, start_server, stop
from dpcdf.service.client.spool import Spool

TESTING = {"DPCDF_TESTING": "1"}
GRID = {"kind": "uniform", "lo": 0.0, "hi": 100.0, "bits": 10}


def uploader(k: int, config, spools: str, stop_at: float, chunk: int, made: list, incomplete: list, lock) -> None:
    """Makes and uploads chunks of fresh values until `stop_at`; one spool per chunk."""
    rng = np.random.default_rng(k)  # simulated data only
    i = 0
    while time.monotonic() < stop_at:
        vals = rng.uniform(0, 100, chunk)
        path = f"{spools}/c{k}-{i}.spool"
        i += 1
        with lock:
            made.append((path, vals))
        try:
            submit(config, vals, batch=chunk, spool=path, retry_for=20)
        except (UploadIncomplete, ServerError):
            with lock:
                incomplete.append(path)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--clients", type=int, default=20)
    ap.add_argument("--seconds", type=float, default=60)
    ap.add_argument("--kills", type=int, default=2)
    ap.add_argument("--victim", type=int, choices=[0, 1], default=1)
    ap.add_argument("--chunk", type=int, default=100, help="reports per client upload")
    args = ap.parse_args()

    with tempfile.TemporaryDirectory(prefix="dpcdf-faults-") as tmp:
        ports = [free_port(), free_port()]
        procs = [start_server(p, f"{tmp}/s{p}", port=ports[p], noise=False, extra_env=TESTING) for p in (0, 1)]
        try:
            urls = [u for _, u in procs]
            config, token = create_task(urls, GRID, 1.0, "tree", "substitution", min_batch=1)
            submit(config, [1.0], spool=f"{tmp}/warm.spool")  # compile the client's kernels before the clock starts
            made, incomplete, lock = [(f"{tmp}/warm.spool", np.array([1.0]))], [], threading.Lock()
            t0 = time.monotonic()
            stop_at = t0 + args.seconds
            threads = [threading.Thread(target=uploader, args=(k, config, tmp, stop_at, args.chunk, made, incomplete, lock))
                       for k in range(args.clients)]
            for t in threads:
                t.start()
            for kill in range(args.kills):  # evenly spread kills, each server down for 3 s
                time.sleep(max(0.0, t0 + args.seconds * (kill + 1) / (args.kills + 1) - time.monotonic()))
                procs[args.victim][0].send_signal(signal.SIGKILL)
                procs[args.victim][0].wait()
                print(f"t={time.monotonic() - t0:5.1f} s: server {args.victim} killed", file=sys.stderr)
                time.sleep(3)
                procs[args.victim] = start_server(args.victim, f"{tmp}/s{args.victim}", port=ports[args.victim],
                                                  noise=False, extra_env=TESTING)
                print(f"t={time.monotonic() - t0:5.1f} s: server {args.victim} restarted", file=sys.stderr)
            for t in threads:
                t.join()
            elapsed = time.monotonic() - t0
            stored = [http("GET", f"{u}/tasks/{config.task_id}", token=token)["reports"] for u in urls]
            acked_before = 0
            for path, vals in made:
                s = Spool.open(path, config.fingerprint)
                acked_before += s.status().complete
                s.close()
            for path, vals in made:  # every client resumes from its spool, as `dpcdf submit` re-run does
                submit(config, vals, batch=args.chunk, spool=path)
            values = np.concatenate([v for _, v in made])
            resumed = [http("GET", f"{u}/tasks/{config.task_id}", token=token)["reports"] for u in urls]
            t1 = time.monotonic()
            analyst = Analyst(config, token)
            n = analyst.close()
            close_time = time.monotonic() - t1
            grid = config.make_grid()
            counts, _ = analyst.prefix_counts(range(grid.size))
            truth = prefix_counts(values, grid)
            exact = bool(np.array_equal(counts, truth))
        finally:
            for proc, _ in procs:
                if proc.poll() is None:
                    stop(proc)

    rows = [("reports made", values.size), ("acknowledged by both before the resume", acked_before),
            ("uploads that ended incomplete (resumed from the spool)", len(incomplete)),
            ("stored per server when the load stopped", f"{stored[0]} / {stored[1]}"),
            ("counted after the close", n), ("duplicates (must be 0)", max(0, n - values.size)),
            ("lost acknowledged reports (must be 0)", max(0, values.size - n)),
            ("one-sided reports dropped at the close (server 0 / 1)", f"{resumed[0] - n} / {resumed[1] - n}"),
            ("every value counted exactly once (noise off)", exact),
            ("sustained reports/s per server (under load)", f"{min(stored) / elapsed:.0f}"),
            ("close time (s)", f"{close_time:.2f}")]
    print(f"{args.clients} clients, {args.seconds:g} s, server {args.victim} killed {args.kills}x\n")
    print(f"{'measure':<56} {'value':>12}")
    for name, value in rows:
        print(f"{name:<56} {str(value):>12}")


if __name__ == "__main__":
    main()
