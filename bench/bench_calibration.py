"""A calibration (Hosmer-Lemeshow) task against a count task, the user's path end to end (issue 46).

    python bench/bench_calibration.py [--n 20000] [--bits 10] [--repeats 3]

Two noise-free servers as real processes on loopback (`start_server --no-noise`, a test-only setting:
the work is the same with noise, the numbers easier to check). Per run, one verified count task and one verified calibration
task of n rows each (probabilities in [0, 1] on a 2^bits grid, labels drawn from them), each made with
`create_task`, uploaded with `submit` (HPKE-sealed reports over HTTP, both servers), then:
"close s" = `Analyst.close()` (the reconciliation and the report check: round one ran as the reports
arrived, `round_one` on each server's background worker, waited for before the close), "answer s" = the
first answer after it (the count task: `release()`, the whole-grid ECDF; the calibration task:
`hosmer_lemeshow(10)`, its groups and the statistic), "close + answer s" their sum. Printed: one row per
task kind (medians over --repeats runs) and the calibration task's close + answer over the count
task's, against issue 46's goal of at most 3x.
"""
from __future__ import annotations

import argparse
import os
import secrets
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_fss import describe_cpu  # noqa: E402 (run from bench/: one CPU line for every bench)

from dpcdf.analyst import Analyst  # noqa: E402
from dpcdf.service.client import create_task, submit  # noqa: E402
from dpcdf.service.http import http  # noqa: E402
from dpcdf.service.processes import start_server, stop  # noqa: E402


def settle(urls: list[str]) -> float:
    """Seconds until neither server has round-one work queued or running (/health/operator `checking`)."""
    t = time.perf_counter()
    while any(http("GET", f"{u}/health/operator", token=os.environ["DPCDF_ADMIN_TOKEN"])["checking"] for u in urls):
        time.sleep(0.05)
    return time.perf_counter() - t


def one_run(urls: list[str], payload: str, n: int, bits: int, seed: int) -> dict:
    rng = np.random.default_rng(seed)  # the data set, not privacy noise
    grid = {"kind": "uniform", "lo": 0.0, "hi": 1.0, "bits": bits}
    config, token = create_task(urls, grid, 1.0, "tree" if payload == "count" else "path", "substitution", 1,
                                payload=payload, verify=True)
    probs = rng.beta(2, 5, n)
    labels = (rng.random(n) < probs).astype(np.int64) if payload == "calibration" else None
    t = time.perf_counter()
    done = submit(config, probs, batch=2000, labels=labels)
    uploaded = time.perf_counter() - t
    assert done["complete"] == n, done
    waited = settle(urls)
    analyst = Analyst(config, token)
    t = time.perf_counter()
    kept = analyst.close()
    close = time.perf_counter() - t
    assert kept in (None, n), kept
    t = time.perf_counter()
    if payload == "calibration":
        hl = analyst.hosmer_lemeshow(10)
        assert np.isfinite(hl.statistic)
    else:
        rel = analyst.release()
        assert abs(rel.total - n) < 1e-6  # noise-free servers: every report counted
    answer = time.perf_counter() - t
    return {"upload": uploaded, "settle": waited, "close": close, "answer": answer}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=20_000)
    ap.add_argument("--bits", type=int, default=10)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    os.environ.setdefault("DPCDF_ADMIN_TOKEN", secrets.token_urlsafe(32))
    print(describe_cpu())
    print(f"two noise-free servers on loopback, verified tasks, n = {args.n:,}, grid 2^{args.bits}, medians of {args.repeats} runs\n")
    tmp = tempfile.mkdtemp(prefix="dpcdf-calibration-")
    procs, urls = [], []
    try:
        for party in (0, 1):
            proc, url = start_server(party, f"{tmp}/s{party}", noise=False, extra_env={"DPCDF_TESTING": "1"})
            procs.append(proc)
            urls.append(url)
        one_run(urls, "count", 500, args.bits, 0)  # compiles and loads the kernels of both kinds, unmeasured
        one_run(urls, "calibration", 500, args.bits, 0)
        rows = {}
        for payload in ("count", "calibration"):
            runs = [one_run(urls, payload, args.n, args.bits, 1 + r) for r in range(args.repeats)]
            rows[payload] = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
        print(f"{'payload':<12} {'upload s':>9} {'round one left s':>16} {'close s':>8} {'answer s':>9} {'close + answer s':>16}")
        for payload, r in rows.items():
            print(f"{payload:<12} {r['upload']:>9.2f} {r['settle']:>16.2f} {r['close']:>8.2f} {r['answer']:>9.2f} "
                  f"{r['close'] + r['answer']:>16.2f}")
        c, k = rows["calibration"], rows["count"]
        ratio = (c["close"] + c["answer"]) / (k["close"] + k["answer"])
        print(f"\ngoal (issue 46): a calibration task's close + answer at most 3x a count task's: "
              f"{'met' if ratio <= 3 else 'NOT met'} ({ratio:.2f}x)")
    finally:
        for proc in procs:
            stop(proc)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
