"""Verified round one at scale (issue 24): in-process against `--dask local:1` and `local:2`.

    python bench/bench_scale_verified.py [--runs 10:1000000 16:3000 20:48]

For each bits:n, n honest reports of a verified count task on a 2^bits grid (server 0's key shares
with the check's extras, generated in chunks of 2^16 and stored as an upload stores them: "store s"),
the collection closed; then, for each mode, a fresh process runs round one from nothing to every
report in a stored batch (`round_one.catch_up`): in-process (numba's threads on both cores) or
mapped over a LocalCluster of single-threaded workers (`dask_check.RoundOneMap`; the cluster's
start and the workers' kernel load are not timed). "reports/s/core" divides by 2 cores (in-process,
local:2) or 1 (local:1); "server cpu s" is the driving process's own CPU time (in-process: the
kernels too; on Dask: reading the shares from SQLite, sending them, storing the results), "worker cpu s" the workers' (all of them). Every mode
must give the same messages, states, extras and grid sums, else
the run stops. `python bench/bench_scale.py --verified` runs this too.
"""
from __future__ import annotations

import argparse
import json
import os
import sqlite3
import subprocess
import sys
import tempfile
import time

import numpy as np

VKEY, VTASK = bytes(range(32)), "bench-verified"


def _verified_config(bits: int):
    from dpcdf.service.task import TaskConfig

    return TaskConfig({"kind": "uniform", "lo": 0.0, "hi": 1.0, "bits": bits}, 1.0, "path", "substitution", 0,
                      ("a", "b"), ("00" * 32, "01" * 32), "00", task_id=VTASK, verify=True)


def prepare_verified(data_dir: str, bits: int, n: int) -> float:
    """n honest reports of a verified count task (server 0's shares, with the check's extras) stored
    and the collection closed; returns the seconds it took."""
    from dpcdf.service.client.data_holder import share_rows
    from dpcdf.service.storage.store import Store

    config, t = _verified_config(bits), time.perf_counter()
    dcf, check, rng = config.key_dcf(), config.check(), np.random.default_rng(n)
    store = Store(os.path.join(data_dir, "server.sqlite"))
    store.add_task(VTASK, config.to_json(), b"bench", b"\0" * 32)
    for start in range(0, n, 1 << 16):
        m = min(1 << 16, n - start)
        betas, x0, _ = check.client_report(np.ones((m, 1), np.int64))
        rows = share_rows(dcf, dcf.gen_batch(rng.integers(0, 1 << bits, m), betas)[0], x0)
        store.add_many(VTASK, [((start + i).to_bytes(16, "big"), rows[i].tobytes()) for i in range(m)])
    store.freeze(VTASK, lambda ids: "bench")
    store.close()
    return time.perf_counter() - t


def child_verified(data_dir: str, mode: str, bits: int) -> dict:
    """Round one of every stored report in one process (in-process, or driving a LocalCluster)."""
    import hashlib
    from dataclasses import dataclass

    from dpcdf.service.protocols.check import round_one
    from dpcdf.service.protocols.context import StepContext
    from dpcdf.service.storage.store import Store
    from fss import field as F

    @dataclass(frozen=True, eq=False)
    class OnCluster(StepContext):
        round_one_map: object = None

    db = sqlite3.connect(os.path.join(data_dir, "server.sqlite"))
    db.execute("DELETE FROM check_batches")  # each mode starts with nothing checked
    db.commit()
    db.close()
    config = _verified_config(bits)
    store = Store(os.path.join(data_dir, "server.sqlite"))
    ctx, evaluator = StepContext.of(config, 0, store, VKEY), None
    round_one.warm_up(("count",))  # kernels loaded (numba's cache): time the work
    if mode != "in-process":
        from dpcdf.service.server.dask_eval import DaskEvaluator

        evaluator = DaskEvaluator(mode)
        evaluator.client.run(round_one.warm_up, ("count",))
        ctx = OnCluster(*vars(ctx).values(), evaluator.round_one)
    try:
        workers = evaluator.client.run(time.process_time) if evaluator else {}
        t, cpu = time.perf_counter(), time.process_time()
        done = round_one.catch_up(ctx)
        took, cpu = time.perf_counter() - t, time.process_time() - cpu
        if evaluator:
            workers = sum(evaluator.client.run(time.process_time)[w] - c for w, c in workers.items())
        batches = store.check_batches(VTASK)
    finally:
        if evaluator is not None:
            evaluator.close()
        store.close()
    h = hashlib.sha256()
    for field in ("message", "state", "extras"):  # per report: the same whatever the batches' cut
        h.update(b"".join(getattr(b, field) for b in batches))
    total = np.zeros(config.check().size, np.uint64)
    for b in batches:
        total = F.add(total, np.frombuffer(b.sums, "<u8").astype(np.uint64))
    h.update(total.tobytes())
    return {"n": done, "seconds": took, "cpu": cpu, "workers_cpu": workers or 0.0, "batches": len(batches), "digest": h.hexdigest()}


def verified(runs: list[str]) -> None:
    print(f"{'bits':>4} {'n':>9} {'mode':>10} {'store s':>7} {'round one s':>11} {'reports/s/core':>14} {'server cpu s':>12} {'worker cpu s':>12} {'batches':>7} {'1->2 workers':>12}")  # noqa: E501
    for run in runs:
        bits, n = (int(v) for v in run.split(":"))
        with tempfile.TemporaryDirectory(prefix="dpcdf-scale-") as tmp:
            stored, results = prepare_verified(tmp, bits, n), {}
            for mode in ("in-process", "local:1", "local:2"):
                out = subprocess.run([sys.executable, __file__, "--child", tmp, mode, str(bits)], check=True,
                                     capture_output=True, text=True).stdout
                r = results[mode] = json.loads(out.strip().splitlines()[-1])
                if r["n"] != n or r["digest"] != results["in-process"]["digest"]:
                    raise SystemExit(f"{mode} gave another round one than in-process at 2^{bits}, n={n}")
                cores = 1 if mode == "local:1" else 2
                speedup = f"{results['local:1']['seconds'] / r['seconds']:.2f}x" if mode == "local:2" else ""
                st = f"{stored:.1f}" if mode == "in-process" else ""
                wcpu = f"{r['workers_cpu']:.2f}" if r["workers_cpu"] else ""
                print(f"{bits:>4} {n:>9} {mode:>10} {st:>7} {r['seconds']:>11.2f} {n / r['seconds'] / cores:>14.0f} "
                      f"{r['cpu']:>12.2f} {wcpu:>12} {r['batches']:>7} {speedup:>12}", flush=True)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", nargs="*", default=["10:1000000", "16:3000", "20:48"], help="bits:n, one table row group each")
    ap.add_argument("--child", nargs=3, metavar=("DATA", "MODE", "BITS"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        data, mode, bits = args.child
        print(json.dumps(child_verified(data, mode, int(bits))))
        return
    print(f"load average before: {os.getloadavg()[0]:.1f}", flush=True)
    verified(args.runs)
    print(f"load average after: {os.getloadavg()[0]:.1f}", flush=True)


if __name__ == "__main__":
    main()
