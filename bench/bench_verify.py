"""Verified vs unverified tasks (issue 12), side by side in one run.

    python bench/bench_verify.py [--sizes 10000,100000,1000000] [--max-seconds 180] [--profile]

1. Client, one core: microseconds to make one report (`make_reports` on --client-batch values: DCF key
   pair, the check's randomness for a verified task, both shares HPKE-sealed) and the report's size
   in bytes (`Report.to_bytes`), for grids of 2^10 and 2^16 points. A verified task's keys are over
   F_p with two field elements of check randomness after each; "x" columns are verified / unverified.
2. Server, one core (`fss.backend.set_threads(1)`, `numba.set_num_threads(1)`): reports/s of the close's
   work per report on in-memory key batches, CPU time, the best of --repeats runs: "eval" =
   `DCF.eval_grid` over the whole grid, "check" = `Check.round_one_sums` (round one and the histogram
   share's column sums, one pass over the grid values), "verify" = the two as the inner loop of
   `round_one.step` (which the servers run while reports arrive) runs them, `round_one.pass_sums`: for
   the MAC'd count and label checks one grid walk with each key's values reduced in cache
   (`DCF.eval_grid_sums`), "eval %" = eval / (eval + check); "decode" (`round_one.decode_shares`, the stored shares into a key batch) is shown apart.
   "AES bound" = pycryptodome AES-128-ECB blocks/s on a 32 MiB buffer (one core) divided by the
   blocks one key's grid walk needs: (N - 1) internal nodes x `expand_blocks` (2 seeds + one block
   per two payload elements: key format version 2, `fss.prg`), plus N x `leaf_blocks` (none for
   width <= 2); "of
   bound" = verify / bound; "at peak" = the reports/s eval_grid alone would allow at the tier's
   register-only AES peak (`bench_fss.peak_blocks_per_s`), the most any check can reach on this CPU.
3. Close and queries, both servers as real processes on loopback (`start_server`, noise on), 2^10 grid,
   count tasks, n reports each. UPLOADS ARE BYPASSED: sealing and uploading 10^6 reports through HPKE
   and HTTP would take minutes of client work that measures neither the close nor the queries (ingest:
   bench/bench_server.py). The task is registered through the real servers (`create_task`), both
   servers are stopped, each one's key shares (`DCF.gen_batch` in bulk; a verified task's share is
   `join_share(key, the client's check randomness)`) are written into its store with
   `Store.add_many` under the same report ids, and the servers restart on the same data. A verified
   task's round one runs in each server's background worker as reports arrive (`round_one`); here it
   starts at the restart, on all n at once: "round one s" = from the restart (process start-up and
   kernel loading included) until neither server's /health shows `checking`, both servers at the
   same time. Then:
   "close s" = `Analyst.close()` (POST /close on server 0, which reconciles with server 1 and, for a
   verified task, runs the report check and stores the histogram share; then on server 1);
   "first q ms" = the first one-threshold query after it (loads the histogram share or the key
   segments); then the median of --repeats runs of one threshold and of all 1,024 grid prefixes
   (`Analyst.prefix_counts(range(1024))`), each asking both servers. Every run checks that the close
   kept all n reports and that the noisy count of all reports is near n. A 256-report task of each
   kind is closed and queried first after every restart, unmeasured (loads the compiled kernels).
   An unverified configuration whose time, scaled linearly from the previous size, would exceed
   --max-seconds is skipped and printed "skipped (over --max-seconds)".
4. With --profile: the verified close at the largest size, replayed in this process phase by phase on
   the stopped servers' stores, on one core (in the real close the two servers prepare at the same
   time, sharing the machine's cores): the reconciliation; round one on each server from scratch
   (`round_one.catch_up`, the collection's work: reading and decoding the shares, then
   `round_one.pass_sums`: eval_grid with round one and the column sums); `round_one.prepare` on each
   server (the close's part: reading the batches back for R); the check's messages (`lead` with `Helper.answer` called directly, no HTTP);
   and `finish` on each server.

Goals (issue 12) are printed next to the numbers: report size <= 2x and time <= 3x; verification
>= 100,000 reports/s per core at 2^10; close with verification at 10^6 and 2^10 <= 10 s; any query
<= 50 ms after that close.
"""
from __future__ import annotations

import argparse
import os
import secrets
import shutil
import signal
import sqlite3
import statistics
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

import numba
import numpy as np

from fss import backend

from bench_fss import best_of, describe_cpu, ecb_blocks_per_s, peak_blocks_per_s, walk_blocks  # one AES bound and one timer for every bench (run from bench/)

from dpcdf.service.protocols.check import round_one
from dpcdf.service.protocols.reconciliation import maths as reconcile
from dpcdf.service.protocols.channel import CHECK
from dpcdf.service.protocols.context import StepContext
from dpcdf.service.protocols.check.exchange import CheckHelper, CheckLeader
from dpcdf.service.client.analyst import Analyst
from dpcdf.service.client import create_task, make_reports
from dpcdf.service.hpke import ServerKeys
from dpcdf.service.http import ServerError, http
from dpcdf.service.processes import free_port, start_server, stop
from dpcdf.service.storage.store import Store
from dpcdf.service.task import TaskConfig, token_hash
from dpcdf.release.calibration import fixed_point
from dpcdf.service.wire import join_share, split_share

E2E_BITS = 10
WARM_N = 256  # reports of the unmeasured warm-up tasks after each restart
CHUNK = 1 << 18  # keys generated and inserted at a time


def grid(bits: int) -> dict:
    return {"kind": "uniform", "lo": 0.0, "hi": 1.0, "bits": bits}


def timed(fn) -> tuple[float, object]:
    t = time.perf_counter()
    out = fn()
    return time.perf_counter() - t, out


def single_core(on: bool) -> None:
    n = 1 if on else numba.config.NUMBA_NUM_THREADS
    backend.set_threads(n)
    numba.set_num_threads(n)


def ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}x"


def verdict(ok: bool) -> str:
    return "met" if ok else "MISSED"


# --- 1. client ----------------------------------------------------------------------------------
def client_section(batch: int, repeats: int, tmp: str) -> None:
    dirs = [Path(tmp) / f"keys{p}" for p in (0, 1)]
    for d in dirs:
        d.mkdir()
    pks = tuple(ServerKeys(d).public_hex("x25519") for d in dirs)
    rng = np.random.default_rng(1)
    single_core(True)
    print(f"## 1. Client: one report (make_reports on {batch} values, one core, median of {max(repeats, 5)} alternating runs)\n")
    print(f"{'payload':<7} {'grid':>5} {'bytes unverified':>16} {'bytes verified':>14} {'size x':>6} {'us unverified':>13} {'us verified':>11} {'time x':>6}")  # noqa: E501
    worst_size, worst_time = 0.0, 0.0
    for payload in ("count", "label"):
        for bits in (10, 16):
            values = rng.uniform(0, 1, batch)
            labels = rng.integers(0, 2, batch) if payload == "label" else None
            configs = {verify: TaskConfig(grid(bits), 1.0, "path", "substitution", 1, ("http://127.0.0.1:1", "http://127.0.0.1:2"),
                                          pks, token_hash("bench"), payload=payload, verify=verify) for verify in (False, True)}
            times: dict[bool, list[float]] = {False: [], True: []}
            size, us = {}, {}
            for cfg in configs.values():
                make_reports(cfg, values[:16], None if labels is None else labels[:16])  # kernels loaded
            for _ in range(max(repeats, 5)):  # alternating, so that other load on the machine hits both alike
                for verify, cfg in configs.items():
                    t, made = timed(lambda: make_reports(cfg, values, labels))
                    times[verify].append(t)
                    size[verify] = len(made[0].to_bytes())
            us = {verify: statistics.median(ts) / batch * 1e6 for verify, ts in times.items()}
            worst_size = max(worst_size, size[True] / size[False])
            worst_time = max(worst_time, us[True] / us[False])
            print(f"{payload:<7} {'2^' + str(bits):>5} {size[False]:>16} {size[True]:>14} {ratio(size[True], size[False]):>6} "
                  f"{us[False]:>13.0f} {us[True]:>11.0f} {ratio(us[True], us[False]):>6}", flush=True)
    single_core(False)
    print(f"\ngoal: report size <= 2x: {verdict(worst_size <= 2)} (worst {worst_size:.2f}x); "
          f"time <= 3x: {verdict(worst_time <= 3)} (worst {worst_time:.2f}x)\n")


# --- 2. server verification throughput -----------------------------------------------------------
def grid_blocks(cfg: TaskConfig) -> int:
    """AES blocks of one key's walk over the whole grid (`fss.portable.eval_grid`)."""
    return walk_blocks(cfg.key_dcf().params, cfg.make_grid().size)


def server_section(repeats: int) -> float:
    """Prints the per-core table; returns verify reports/s for count at 2^10."""
    single_core(True)
    ecb = ecb_blocks_per_s()
    tier = grid_backend()
    peak = peak_blocks_per_s(tier) if tier != "portable" else ecb
    print("## 2. Server: the close's work per report, one core, in memory\n")
    print(f"pycryptodome AES-128-ECB: {ecb / 1e6:.0f} M blocks/s on one core; tier {tier}'s register-only peak: "
          f"{peak / 1e6:.0f} M blocks/s\n")
    print(f"{'payload':<7} {'grid':>5} {'keys':>5} {'decode/s':>9} {'eval/s':>8} {'check/s':>9} {'verify/s':>8} {'eval %':>6} {'AES blocks':>10} {'AES bound/s':>11} {'of bound':>8} {'at peak/s':>9}")  # noqa: E501
    headline, headline_peak = 0.0, 0.0
    for payload in ("count", "label", "calibration"):
        for bits in (10, 16):
            cfg = TaskConfig(grid(bits), 1.0, "path", "substitution", 1, ("a", "b"), ("00", "01"), "00",
                             payload=payload, verify=True)
            dcf, check, size = cfg.key_dcf(), cfg.check(), cfg.make_grid().size  # keys with the MAC's payload
            n = round_one.keys_per_pass(size, dcf.width)  # one batch of `round_one.step`
            rng = np.random.default_rng(bits)
            labels, values = rng.integers(0, 2, n), rng.uniform(0, 1, n)
            rows = {"count": np.ones((n, 1), np.int64), "label": np.stack([labels, 1 - labels], axis=1),
                    "calibration": np.stack([np.ones(n, np.int64), labels, fixed_point(values).astype(np.int64)], axis=1)}[payload]
            key_betas, x0, _ = check.client_report(rows)
            k0, _ = dcf.gen_batch(cfg.make_grid().index(values), key_betas)
            shares = [join_share(k0[i].to_bytes(), x0[i]) for i in range(n)]
            ch = check.challenges(secrets.token_bytes(32), b"bench")
            state = {}

            def decode():  # the servers' decoder (one vectorized pass over the stored shares)
                state["batch"], state["x"] = round_one.decode_shares(dcf, check.extras, shares, 0)

            def evaluate():
                state["y"] = round_one.grid_values(dcf, state["batch"], size)

            def one():  # round one and the column sums, one pass over the grid values
                check.round_one_sums(0, state["y"], state["x"], ch)

            def verify():  # what `round_one.step` runs on a batch
                round_one.pass_sums(dcf, check, 0, state["batch"], state["x"], ch)

            decode()
            evaluate()
            one()
            verify()
            t_dec = best_of(decode, repeats)
            t_eval = best_of(evaluate, repeats)
            t_one = best_of(one, repeats)
            rate = n / best_of(verify, repeats)
            blocks = grid_blocks(cfg)
            bound = ecb / blocks
            if payload == "count" and bits == 10:
                headline, headline_peak = rate, peak / blocks
            print(f"{payload:<7} {'2^' + str(bits):>5} {n:>5} {n / t_dec:>9.0f} {n / t_eval:>8.0f} {n / t_one:>9.0f} "
                  f"{rate:>8.0f} {t_eval / (t_eval + t_one):>6.0%} {blocks:>10} {bound:>11.0f} {rate / bound:>8.1%} "
                  f"{peak / blocks:>9.0f}", flush=True)
    single_core(False)
    print(f"\ngoal: verification >= 100,000 reports/s per core at 2^10 (count): {verdict(headline >= 100_000)} "
          f"({headline:,.0f} reports/s; eval_grid alone at {tier}'s AES peak would allow {headline_peak:,.0f})\n")
    return headline


# --- 3. close and queries on real servers ----------------------------------------------------------
def insert(config: TaskConfig, dirs: list[str], n: int, seed: int) -> None:
    """n honest reports' shares straight into both servers' stores (the servers stopped), same ids."""
    dcf, size = config.key_dcf(), config.make_grid().size
    check = config.check() if config.verify else None
    tail = 8 * check.extras if check else 0
    rng = np.random.default_rng(seed)
    stores = [Store(Path(d) / "server.sqlite") for d in dirs]
    body = dcf.params.body_len
    try:
        for start in range(0, n, CHUNK):
            m = min(CHUNK, n - start)
            betas, *extras = check.client_report(np.ones((m, 1), np.int64)) if check else (1, None, None)
            k = dcf.gen_batch(rng.integers(0, size, m), betas)
            ids = [secrets.token_bytes(16) for _ in range(m)]
            for party, store in enumerate(stores):
                rows = np.empty((m, dcf.key_size + tail), np.uint8)
                rows[:, :8] = np.frombuffer(dcf.params.header(party), np.uint8)
                rows[:, 8:dcf.key_size] = np.frombuffer(k[party].to_bytes(), np.uint8, offset=16).reshape(m, body)
                if check:
                    rows[:, dcf.key_size:] = extras[party].astype("<u8").view(np.uint8).reshape(m, tail)
                if start == 0:  # the bulk layout is exactly what a client would send
                    one = k[party][0].to_bytes()
                    assert rows[0].tobytes() == (join_share(one, extras[party][0]) if check else one)
                    split_share(rows[0].tobytes(), dcf.key_size, check.extras if check else 0)
                store.add_many(config.task_id, [(ids[i], rows[i].tobytes()) for i in range(m)])
    finally:
        for store in stores:
            store.close()


class Servers:
    """Both servers on fixed loopback ports (the task configs name them), restartable on their data."""

    def __init__(self, tmp: str):
        self.dirs = [f"{tmp}/s0", f"{tmp}/s1"]
        self.ports = [free_port(), free_port()]
        self.logs = [open(f"{tmp}/server{p}.log", "ab") for p in (0, 1)]
        self.procs = []
        self.urls = []

    def start(self) -> None:
        self.started = time.perf_counter()
        started = [start_server(p, self.dirs[p], port=self.ports[p], noise=True, log=self.logs[p]) for p in (0, 1)]
        self.procs, self.urls = [p for p, _ in started], [u for _, u in started]
        while not all(http("GET", f"{u}/health")["warm"] for u in self.urls):  # kernels compiled: measure the work
            time.sleep(0.2)

    def settle(self) -> float:
        """Seconds from the start until neither server has round-one work queued or running (/health
        `checking`): process start-up and kernel loading included."""
        while any(http("GET", f"{u}/health/operator", token=os.environ["DPCDF_ADMIN_TOKEN"])["checking"] for u in self.urls):
            time.sleep(0.05)
        return time.perf_counter() - self.started

    def stop(self) -> None:
        for proc in self.procs:
            stop(proc)
        self.procs = []

    def close(self) -> None:
        self.stop()
        for log in self.logs:
            log.close()


def close_task(analyst: Analyst) -> tuple[float, int, int]:
    """Analyst.close(), called again after a timeout of its HTTP request or a 502 (server 0 waited past
    its peer timeout for server 1), as the analyst is told to: (wall time until the close answered,
    reports kept, closes retried)."""
    t, retries = time.perf_counter(), 0
    while True:
        try:
            kept = analyst.close()
            return time.perf_counter() - t, kept, retries
        except ServerError as exc:
            if retries >= 3 or exc.status not in (None, 502):
                raise
            retries += 1


def measure(config: TaskConfig, token: str, n: int, repeats: int) -> dict:
    analyst = Analyst(config, token)
    close, kept, retries = close_task(analyst)
    assert kept == n, f"the close kept {kept} of {n} honest reports"
    first, _ = timed(lambda: analyst.prefix_counts([512]))
    one = [timed(lambda: analyst.prefix_counts([512]))[0] for _ in range(repeats)]
    many = []
    for _ in range(repeats):
        t, (counts, _) = timed(lambda: analyst.prefix_counts(range(1 << E2E_BITS)))
        many.append(t)
        assert abs(int(counts[-1]) - n) < max(1000, n // 100), f"noisy count of all {n} reports: {counts[-1]}"
    return {"close": close, "retries": retries, "first": first, "one": statistics.median(one), "many": statistics.median(many)}


def e2e_section(sizes: list[int], repeats: int, max_seconds: float, profile: bool, tmp_root: str) -> None:
    print(f"## 3. Close and queries: two server processes on loopback, 2^{E2E_BITS} grid, count tasks, noise on\n")
    print("Uploads are bypassed: each server's key shares are written into its store directly (the task\n"
          "registered through the servers, both stopped for the insert, then restarted), since sealing and\n"
          "uploading 10^6 reports takes minutes of client work that is not what this measures.\n")
    print(f"{'n':>9} {'verify':>6} {'round one s':>11} {'close s':>8} {'first q ms':>10} {'1 threshold ms':>14} {'1024 prefixes ms':>16}")
    previous: dict[bool, tuple[int, float]] = {}
    results: dict[tuple[int, bool], dict] = {}
    for n in sizes:
        tmp = tempfile.mkdtemp(prefix="dpcdf-verify-", dir=tmp_root)
        servers = Servers(tmp)
        try:
            servers.start()
            tasks = {}
            for verify in (True, False):
                tasks[verify] = create_task(servers.urls, grid(E2E_BITS), 1.0, "path", "substitution", 1, verify=verify)
                tasks[("warm", verify)] = create_task(servers.urls, grid(E2E_BITS), 1.0, "path", "substitution", 1, verify=verify)
            servers.stop()
            run = {}
            for verify in (True, False):
                estimate = None
                if verify is False and verify in previous:
                    n0, total0 = previous[verify]
                    estimate = total0 * n / n0
                run[verify] = estimate is None or estimate <= max_seconds
                insert(tasks[("warm", verify)][0], servers.dirs, WARM_N, seed=n + 1)
                if run[verify]:
                    insert(tasks[verify][0], servers.dirs, n, seed=n)
            servers.start()
            checking = servers.settle()  # round one of the inserted verified reports (the collection's work)
            for verify in (True, False):
                measure(*tasks[("warm", verify)], WARM_N, 1)
            for verify in (True, False):
                label = "yes" if verify else "no"
                if not run[verify]:
                    skip = "skipped (over --max-seconds)"
                    print(f"{n:>9} {label:>6} {'':>11} {skip}", flush=True)
                    continue
                t0 = time.perf_counter()
                r = results[(n, verify)] = measure(*tasks[verify], n, repeats)
                previous[verify] = (n, time.perf_counter() - t0)
                note = f"  (close retried {r['retries']}x after a timeout or 502)" if r["retries"] else ""
                before = f"{checking:>11.2f}" if verify else f"{'-':>11}"
                print(f"{n:>9} {label:>6} {before} {r['close']:>8.2f} {r['first'] * 1e3:>10.0f} {r['one'] * 1e3:>14.0f} "
                      f"{r['many'] * 1e3:>16.0f}{note}", flush=True)
            servers.stop()
            if profile and n == sizes[-1]:
                profiled = profile_close(tasks[True][0], servers.dirs, n)
        except BaseException:
            for p, log in enumerate(servers.logs):
                log.flush()
                tail = Path(f"{tmp}/server{p}.log").read_text(errors="replace")[-3000:]
                print(f"\n--- server {p} log (tail) ---\n{tail}")
            raise
        finally:
            servers.close()
            shutil.rmtree(tmp, ignore_errors=True)
    big = max(sizes)
    verified = results.get((big, True))
    print()
    if big >= 1_000_000 and verified:
        unver = results.get((big, False))
        worst = max(verified["first"], verified["one"], verified["many"])
        print(f"goal: close with verification at n = {big:,}, 2^{E2E_BITS} grid, <= 10 s: "
              f"{verdict(verified['close'] <= 10)} ({verified['close']:.1f} s)")
        print(f"goal: any query <= 50 ms after that close: {verdict(worst <= 0.050)} (slowest {worst * 1e3:.0f} ms"
              + (f"; unverified: 1,024 prefixes in {unver['many']:.1f} s)" if unver else ")"))
    else:
        print(f"goals at n = 10^6: not measured (largest n here: {big:,})")
    if profile:
        print_profile(profiled, big, verified["close"] if verified else None)


# --- 4. where the verified close spends its time ----------------------------------------------------
@contextmanager
def timers(acc: dict):
    """Times decoding and the grid walk with round one (`round_one.pass_sums`) inside `round_one.step`
    (patched here)."""
    decode, one = round_one.decode_shares, round_one.pass_sums

    def wrap(name, fn):
        def run(*a, **k):
            t = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                acc[name] = acc.get(name, 0.0) + time.perf_counter() - t
        return run

    round_one.decode_shares = wrap("decode", decode)
    round_one.pass_sums = wrap("eval_grid + round_one_sums", one)
    try:
        yield
    finally:
        round_one.decode_shares, round_one.pass_sums = decode, one


def profile_close(config: TaskConfig, dirs: list[str], n: int) -> list[tuple[str, float]]:
    """The verified close replayed in this process on the stopped servers' stores (all cores)."""
    from dpcdf.service.server.state import pair_key  # the servers' own derivation of their shared key

    single_core(True)
    task = config.task_id
    for d in dirs:  # the close is done: let round one and `finish` run again on these throwaway stores
        db = sqlite3.connect(f"{d}/server.sqlite")
        db.execute("UPDATE tasks SET verified_at = NULL, answered_at = NULL WHERE task_id = ?", (task,))  # run again
        db.execute("DELETE FROM check_batches WHERE task_id = ?", (task,))
        db.execute("DELETE FROM exchanges WHERE task_id = ?", (task,))  # the journals: run every step again
        db.commit()
        db.close()
    stores = [Store(Path(d) / "server.sqlite") for d in dirs]
    keys = [pair_key(config, p, ServerKeys(Path(dirs[p]))) for p in (0, 1)]
    assert keys[0] == keys[1]
    key, rows = keys[0], []
    ctxs = [StepContext.of(config, p, stores[p], key) for p in (0, 1)]  # each server's context of the task
    try:
        t0 = time.perf_counter()
        ids = [s.frozen_ids(task) for s in stores]  # the reconciliation's arithmetic, both servers
        plan = reconcile.drops(key, ids[0], reconcile.differences(key, ids[1], reconcile.bucket_digests(key, ids[0])))
        for body, expected in zip(plan.bodies, plan.acks):
            reconcile.check_ack(reconcile.take_drops(key, ids[1], body).ack, expected)
        rows.append(("reconciliation (both servers)", time.perf_counter() - t0))
        for party in (0, 1):
            acc: dict[str, float] = {}
            with timers(acc):
                t, _ = timed(lambda: round_one.catch_up(ctxs[party]))
            rows.append((f"round one, server {party} (while reports arrive)", t))
            rows.append(("  read the shares, store the batches", t - sum(acc.values())))
            rows += [(f"  {name}", acc[name]) for name in ("decode", "eval_grid + round_one_sums")]
        local = []
        for party in (0, 1):
            t, loc = timed(lambda: round_one.prepare(ctxs[party]))
            local.append(loc)
            rows.append((f"prepare, server {party} (batches of R, id order)", t))
        helper = CheckHelper(ctxs[1], local[1], secrets.token_bytes(32))
        leader = CheckLeader(ctxs[0], local[0])
        t, _ = timed(lambda: leader.run(lambda m: helper.answer(ctxs[1].channel.open(m, CHECK, helper.context))))
        assert all(not s.rejections(task) for s in stores)
        rows.append(("messages 5-12 with both finishes (in process, no HTTP)", t))
    finally:
        for s in stores:
            s.close()
        single_core(False)
    return rows


def print_profile(rows: list[tuple[str, float]], n: int, close: float | None) -> None:
    print(f"\n## 4. The verified close at n = {n:,}, replayed phase by phase in one process, one core\n")
    print("One phase after the other on one core. Round one is the collection's work (each server's\n"
          "background worker, as reports arrive); the close is the rest. In the real close both servers\n"
          "prepare at the same time, sharing this machine's cores, and the messages go over HTTP.\n")
    print(f"{'phase':<44} {'s':>8}")
    for name, t in rows:
        print(f"{name:<44} {t:>8.2f}")
    if close is not None:
        print(f"{'(measured close over HTTP, both servers)':<44} {close:>8.2f}")


def grid_backend() -> str:
    """The backend `DCF.eval_grid` takes for a verified task's keys (the fused kernel, where fss has one)."""
    choose = getattr(backend, "_grid_for", None)
    params = TaskConfig(grid(E2E_BITS), 1.0, "path", "substitution", 1, ("a", "b"), ("00", "01"), "00", verify=True).dcf().params
    return (choose(params) or "portable") if choose else "portable"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="10000,100000,1000000", help="report counts of part 3, comma-separated")
    ap.add_argument("--max-seconds", type=float, default=180.0,
                    help="skip an unverified configuration of part 3 predicted (linearly from the previous size) to take longer")
    ap.add_argument("--client-batch", type=int, default=2000, help="values per make_reports call in part 1")
    ap.add_argument("--repeats", type=int, default=3, help="runs per measurement (best of, or median for latencies)")
    ap.add_argument("--profile", action="store_true", help="part 4: the verified close at the largest size, phase by phase")
    ap.add_argument("--skip", default="", help="parts to leave out, e.g. 1,2 (for a quick look at part 3)")
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    skip = {s.strip() for s in args.skip.split(",") if s.strip()}
    print(f"CPU: {describe_cpu()}")
    print(f"{numba.config.NUMBA_NUM_THREADS} cores, fss backend {backend.current()}, eval_grid of F_p keys: {grid_backend()}; "
          f"load average at start {os.getloadavg()[0]:.1f}\n")
    with tempfile.TemporaryDirectory(prefix="dpcdf-verify-") as tmp:
        if "1" not in skip:
            client_section(args.client_batch, args.repeats, tmp)
        if "2" not in skip:
            server_section(args.repeats)
        if "3" not in skip:
            e2e_section(sizes, args.repeats, args.max_seconds, args.profile, tmp)
    print(f"\nload average at the end {os.getloadavg()[0]:.1f} (other work on this machine slows every number above)")


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # `timeout` or kill: stop the servers on the way out
    main()
