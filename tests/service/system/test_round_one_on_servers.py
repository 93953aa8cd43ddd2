"""Round one of the report check on real servers: the security and fault review of round one during the collection (commit 8debdb9, `round_one`).

Attacks by clients (different keys or orders on the two servers, one-sided forgeries, uploads racing
the close), consistency of the stored batches (other tasks interleaved, drops, check exclusions,
a server killed while its worker runs, stores without check_batches or with a batch lost), and the
worker itself. Real server processes on loopback (noise off) where it matters.

A test marked `# BUG:` asserted the correct behaviour and failed on the code as reviewed (fixed in
77735fa: the check kernels are single-threaded)."""
from __future__ import annotations

import os
import secrets
import signal
import sqlite3
import threading
import time

import numpy as np
import pytest

from dpcdf.release.ecdf import prefix_counts
from fss import backend as fss_backend
from dpcdf.service.protocols.check import round_one
from dpcdf.service.client.analyst import Analyst
from dpcdf.service.client import create_task, make_reports, submit
from dpcdf.service.hpke import ServerKeys
from dpcdf.service.http import ServerError, http
from dpcdf.service.processes import free_port, start_server, stop
from dpcdf.service.protocols.context import StepContext
from dpcdf.service.server.checker import Checker
from dpcdf.service.server.state import pair_key
from dpcdf.service.storage.store import Store
from dpcdf.service.task import TaskConfig
from dpcdf.service.wire import encode_batch, join_share
from helpers import OPERATOR, TESTING, values
from test_malicious_clients import forged, reason, seal

GRID = {"kind": "thresholds", "values": [float(v) for v in range(50)]}
BIG = {"kind": "thresholds", "values": [float(v) for v in range(2048)]}  # 2048 keys per round-one pass
OCT = "application/octet-stream"


class Pair:
    """Two noise-off servers on fixed ports (so either restarts at the same URL)."""

    def __init__(self, base, env=None):
        self.base, self.env, self.logs = base, {**TESTING, **(env or {})}, []
        self.ports = [free_port(), free_port()]
        self.procs = [self._start(0), self._start(1)]
        self.urls = [f"http://127.0.0.1:{p}" for p in self.ports]

    def _start(self, party):
        log = open(self.base / f"s{party}.{len(self.logs)}.log", "wb")
        self.logs.append(log)
        return start_server(party, str(self.base / f"s{party}"), port=self.ports[party], noise=False, log=log,
                            extra_env=self.env)[0]

    def db(self, party):
        return self.base / f"s{party}" / "server.sqlite"

    def kill(self, party):
        os.kill(self.procs[party].pid, signal.SIGKILL)
        self.procs[party].wait()

    def restart(self, party):
        self.procs[party] = self._start(party)

    def alive(self):
        return [p.poll() is None for p in self.procs]

    def close(self):
        for p in self.procs:
            if p.poll() is None:
                stop(p)
        for log in self.logs:
            log.close()


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    p = Pair(tmp_path_factory.mktemp("round_one_review"))
    yield p
    p.close()


def settled(urls, timeout=60.0):
    end = time.monotonic() + timeout
    while any(http("GET", f"{u}/health/operator", token=OPERATOR)["checking"] for u in urls):
        assert time.monotonic() < end, "round one did not finish"
        time.sleep(0.05)


def post(url, task_id, reports: list[bytes]) -> dict:
    return http("POST", f"{url}/tasks/{task_id}/reports/batch", encode_batch(reports), content_type=OCT)


def close(config, token):
    views = [http("POST", f"{u}/tasks/{config.task_id}/close", b"", token) for u in config.servers]
    assert views[0]["reports_hash"] == views[1]["reports_hash"]
    assert views[0]["rejected"] == views[1]["rejected"]
    return views[0]


def exact(config, token, vals):
    size = config.make_grid().size
    counts, n = Analyst(config, token).prefix_counts(list(range(size)))
    np.testing.assert_array_equal(counts, prefix_counts(np.asarray(vals, float), config.make_grid()))
    return n


def stored_batches(db, task_id):
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        rows = con.execute("SELECT first_seq, last_seq, n FROM check_batches WHERE task_id = ? ORDER BY first_seq",
                           (task_id,)).fetchall()
        count = con.execute("SELECT count(*) FROM reports WHERE task_id = ?", (task_id,)).fetchone()[0]
    finally:
        con.close()
    return rows, count


def consecutive(db, task_id):
    """Every stored report of the task in exactly one batch, batches in order, never overlapping."""
    rows, count = stored_batches(db, task_id)
    assert sum(n for _, _, n in rows) == count
    assert all(a[1] < b[0] for a, b in zip(rows, rows[1:]))


# --- 1. malicious clients ---------------------------------------------------------------------------

def test_orders_batch_cuts_mismatched_keys_and_one_sided_forgeries_leave_the_release_exact(pair):
    """Server 0 gets the honest reports in upload order in batches of 50, server 1 reversed in
    batches of 7, with two other tasks' reports (one verified, one not) between them; one report id
    carries keys of two different pairs (server 0 gets it first, server 1 last: another batch and
    position on each server); a payload-10^6 forgery reaches server 0 only and an honest report
    server 1 only, and one whose share for server 0 does not decode there (refused at the upload, so
    one-sided on server 1). The release is the honest reports' exact counts, the mismatched id is excluded
    under its class, the one-sided ones are dropped with their grid values."""
    config, token = create_task(pair.urls, GRID, 1.0, "tree", "substitution", min_batch=0)
    other, other_token = create_task(pair.urls, GRID, 1.0, "tree", "substitution", min_batch=0)
    plain, _ = create_task(pair.urls, GRID, 1.0, "tree", "substitution", min_batch=0, verify=False)
    assert config.verify and other.verify and not plain.verify
    vals = values(300, 41) % 49.0
    other_vals = values(90, 42) % 49.0
    honest = [r.to_bytes() for r in make_reports(config, vals)]
    others = [r.to_bytes() for r in make_reports(other, other_vals)]
    plains = [r.to_bytes() for r in make_reports(plain, values(30, 43) % 49.0)]
    a, b = forged(config, 3), forged(config, 33)
    mixed = (a[0], b[1])
    mismatched = seal(config, mixed)
    forgery = seal(config, forged(config, 7, 10**6))  # to server 0 only
    lonely = make_reports(config, [12.0])[0].to_bytes()  # an honest report to server 1 only
    assert post(pair.urls[0], config.task_id, [mismatched, forgery])["accepted"] == 2
    for k in range(0, 300, 50):
        assert post(pair.urls[0], config.task_id, honest[k:k + 50])["accepted"] == 50
        post(pair.urls[0], other.task_id, others[k // 50 * 15:(k // 50 + 1) * 15])
        post(pair.urls[0], plain.task_id, plains[k // 50 * 5:(k // 50 + 1) * 5])
    rev = honest[::-1]
    for k in range(0, 300, 7):
        assert post(pair.urls[1], config.task_id, rev[k:k + 7])["accepted"] == len(rev[k:k + 7])
        if k % 21 == 0:
            post(pair.urls[1], other.task_id, others[k // 21 * 6:(k // 21 + 1) * 6])
            post(pair.urls[1], plain.task_id, plains[k // 21 * 2:(k // 21 + 1) * 2])
    assert post(pair.urls[1], config.task_id, [lonely, mismatched])["accepted"] == 2
    c = forged(config, 20)
    undecodable = seal(config, (c[1], c[1]))  # server 0's share is a key for party 1: it must not decode there
    res = post(pair.urls[0], config.task_id, [undecodable])
    assert res["accepted"] == 0 and [r["index"] for r in res["rejected"]] == [0]  # refused, never in a batch
    assert post(pair.urls[1], config.task_id, [undecodable])["accepted"] == 1  # one-sided on server 1: dropped
    settled(pair.urls)
    for party in (0, 1):
        consecutive(pair.db(party), config.task_id)
        consecutive(pair.db(party), other.task_id)
        assert len(stored_batches(pair.db(party), config.task_id)[0]) > 1  # cut differently on each server
    expected = reason(config, mixed)
    assert expected is not None
    view = close(config, token)
    assert view["n"] == 300 and view["rejected"] == {expected: 1}
    assert exact(config, token, vals) == 300
    view = close(other, other_token)
    assert view["n"] == 90 and view["rejected"] == {}
    exact(other, other_token, other_vals)


def test_uploads_racing_the_close_count_exactly_the_reports_both_servers_took(pair):
    """Clients keep uploading single reports (to server 0 then 1, or 1 then 0) while the analyst
    closes: whatever lands on both servers before their freezes counts once, the rest (one side
    only, or refused) not at all, and the worker's batches taken before the freeze match."""
    config, token = create_task(pair.urls, GRID, 1.0, "tree", "substitution", min_batch=0)
    first = values(60, 51) % 49.0
    submit(config, first, batch=60)
    late = values(240, 52) % 49.0
    reports = [r.to_bytes() for r in make_reports(config, late)]
    took = [[False, False] for _ in reports]
    started = threading.Event()

    def client(idx):
        for i in idx:
            order = (0, 1) if i % 2 else (1, 0)
            for party in order:
                try:
                    res = post(pair.urls[party], config.task_id, [reports[i]])
                    took[i][party] = res["accepted"] == 1
                except ServerError as exc:
                    assert exc.status == 409, exc
            started.set()

    threads = [threading.Thread(target=client, args=(range(k, len(reports), 4),)) for k in range(4)]
    for t in threads:
        t.start()
    started.wait(10)
    time.sleep(0.3)
    view = close(config, token)
    for t in threads:
        t.join()
    both = [v for v, (t0, t1) in zip(late, took) if t0 and t1]
    assert view["n"] == 60 + len(both) and view["rejected"] == {}
    exact(config, token, np.concatenate([first, both]))
    for party in (0, 1):
        consecutive(pair.db(party), config.task_id)


def test_challenges_are_equal_on_both_servers_and_bound_to_the_servers_key_and_task(tmp_path):
    """The challenges need K (X25519 of the two servers' keys); the task config a client sees has
    only public keys. Both servers derive the same ones; another task, or a key a client could
    compute from public data, gives others."""
    for p in (0, 1):
        (tmp_path / f"k{p}").mkdir()
    keys = [ServerKeys(tmp_path / f"k{p}") for p in (0, 1)]
    config = TaskConfig(GRID, 1.0, "path", "substitution", 0, ("a", "b"), tuple(k.public_hex("x25519") for k in keys), "00")
    other = TaskConfig(GRID, 1.0, "path", "substitution", 0, ("a", "b"), tuple(k.public_hex("x25519") for k in keys), "01")
    check = config.check()
    k0, k1 = pair_key(config, 0, keys[0]), pair_key(config, 1, keys[1])
    assert k0 == k1
    c0, c1 = round_one.challenges(check, k0, config.task_id), round_one.challenges(check, k1, config.task_id)
    z = np.zeros((1, 50, check.key_width), np.uint64)  # the value and its MAC tag (kappa = 0 here)
    z[0, 7:, 0] = 1
    m0 = check.round_one(0, z, np.zeros((1, check.extras), np.uint64), c0)[0]
    assert np.array_equal(m0, check.round_one(0, z, np.zeros((1, check.extras), np.uint64), c1)[0])
    for key, task in ((pair_key(other, 0, keys[0]), other.task_id), (k0, other.task_id),
                      (config.fingerprint.ljust(32, b"\0"), config.task_id),  # public data, not K
                      (bytes.fromhex(config.hpke_keys[0]), config.task_id)):
        guess = round_one.challenges(check, key, task)
        assert not np.array_equal(m0, check.round_one(0, z, np.zeros((1, check.extras), np.uint64), guess)[0])


# --- 2. consistency at the store --------------------------------------------------------------------

def _shares(config, n, party, seed):
    rng = np.random.default_rng(seed)
    dcf, check = config.key_dcf(), config.check()
    betas, *x = check.client_report(np.ones((n, 1), np.int64))
    keys = dcf.gen_batch(rng.integers(0, 50, n), betas)
    return [(secrets.token_bytes(16), join_share(keys[party][i].to_bytes(), x[party][i])) for i in range(n)]


def test_every_report_dropped_and_a_batch_taken_across_the_freeze(tmp_path):
    """A batch read before the freeze and stored after it holds exactly the frozen reports; a set
    whose every report the reconciliation dropped gives an empty R and a zero sum."""
    config = TaskConfig(GRID, 1.0, "path", "substitution", 0, ("a", "b"), ("00" * 32, "01" * 32), "00")
    key, party = bytes(range(32)), 0
    store = Store(tmp_path / "server.sqlite")
    try:
        store.add_task(config.task_id, config.to_json(), b"fp", b"seed")
        items = _shares(config, 40, party, 3)
        store.add_many(config.task_id, items[:25])
        seqs, ids, shares = store.unchecked(config.task_id, 100)  # the worker's read
        store.freeze(config.task_id, lambda ids: str(len(ids)))
        with pytest.raises(Exception):
            store.add_many(config.task_id, items[25:])
        assert len(ids) == 25
        ctx = StepContext.of(config, party, store, key)
        round_one.step(ctx)
        assert round_one.step(ctx) == 0
        store.exclude(config.task_id, [rid for rid, _ in items[:25]], lambda ids: str(len(ids)))
        local = round_one.prepare(ctx)
        assert local.ids == [] and not local.total.any()
    finally:
        store.close()


def test_one_sided_reports_cost_the_server_two_grid_walks_each(tmp_path, monkeypatch):
    """Not a correctness bug, a cost: a report the reconciliation drops was walked over the grid by
    the worker and is walked again at the close to subtract it (before this change: never). A
    client that uploads to one server only (half the sealing work of an honest one) costs that
    server two evaluations per report, the second inside the close."""
    config = TaskConfig(GRID, 1.0, "path", "substitution", 0, ("a", "b"), ("00" * 32, "01" * 32), "00")
    key, party = bytes(range(32)), 1
    walked = []  # keys walked over the grid, by either path (the MAC'd checks' round one walks in `eval_grid_sums`)
    for name in ("eval_grid", "eval_grid_sums"):
        real = getattr(fss_backend, name)
        monkeypatch.setattr(fss_backend, name, lambda batch, *args, _real=real: walked.append(len(batch)) or _real(batch, *args))
    store = Store(tmp_path / "server.sqlite")
    try:
        store.add_task(config.task_id, config.to_json(), b"fp", b"seed")
        honest, lonely = _shares(config, 50, party, 4), _shares(config, 200, party, 5)
        store.add_many(config.task_id, honest + lonely)
        ctx = StepContext.of(config, party, store, key)
        round_one.catch_up(ctx)
        store.freeze(config.task_id, lambda ids: str(len(ids)))
        store.exclude(config.task_id, [rid for rid, _ in lonely], lambda ids: str(len(ids)))
        local = round_one.prepare(ctx)
        assert len(local.ids) == 50
        assert sum(walked) == 50 + 2 * 200
    finally:
        store.close()


# --- 3. crashes and restarts ------------------------------------------------------------------------

def test_killed_while_the_worker_runs_and_stores_without_or_missing_batches_close_exactly(pair):
    """Task 1 (6,000 reports, 2,048 grid points: several passes): both servers SIGKILLed while
    their workers run. Task 2 (settled): its last batch deleted on server 0 (a crash before it was
    stored) and server 1's check_batches table dropped (a store from before this change). After the
    restarts both close to their exact counts, every report in exactly one batch."""
    t2, tok2 = create_task(pair.urls, GRID, 1.0, "tree", "substitution", min_batch=0)
    v2 = values(200, 61) % 49.0
    submit(t2, v2, batch=40)
    settled(pair.urls)
    t1, tok1 = create_task(pair.urls, BIG, 1.0, "tree", "substitution", min_batch=0)
    v1 = values(6000, 62) * 20.0
    reports = [r.to_bytes() for r in make_reports(t1, v1)]
    for party, delay in ((0, 0.0), (1, 0.12)):  # killed as its worker starts (0), or after some passes (1)
        assert post(pair.urls[party], t1.task_id, reports)["accepted"] == 6000
        time.sleep(delay)
        pair.kill(party)
    before = [sum(n for _, _, n in stored_batches(pair.db(p), t1.task_id)[0]) for p in (0, 1)]
    con = sqlite3.connect(pair.db(0))
    con.execute("DELETE FROM check_batches WHERE task_id = ? AND first_seq = (SELECT max(first_seq) FROM check_batches "
                "WHERE task_id = ?)", (t2.task_id, t2.task_id))
    con.commit()
    con.close()
    con = sqlite3.connect(pair.db(1))
    con.execute("DROP TABLE check_batches")
    con.execute("PRAGMA user_version = 4")  # as a store from before round one was: the migrations add the table
    con.commit()
    con.close()
    pair.restart(0)
    pair.restart(1)
    for config, token, vals in ((t1, tok1, v1), (t2, tok2, v2)):
        view = close(config, token)
        assert view["n"] == len(vals) and view["rejected"] == {}
        exact(config, token, vals)
        for party in (0, 1):
            consecutive(pair.db(party), config.task_id)
    print("reports in batches at the kills:", before)


# --- 4. the worker ----------------------------------------------------------------------------------

class _FakeServer:
    def __init__(self):
        self.party = 0

        class _Store:
            path = "fake"

            def tasks_to_check(self):
                return []

            def marked(self, task_id, mark):
                return False

        store = _Store()

        class _St:  # a task's state holds its context (`TaskState.ctx`); the worker hands it on whole
            config = type("C", (), {"verify": True, "task_id": "t"})()
            ctx = type("Ctx", (), {"config": config, "party": 0, "store": store, "pair_key": b"k" * 32})()

        self.store, self._st = store, _St()

    def task(self, task_id):
        return self._st


def test_the_worker_survives_a_failing_round_one_and_takes_the_next_wake(monkeypatch):
    calls = []

    def catch_up(ctx):
        calls.append(ctx.config.task_id)
        if len(calls) == 1:
            raise RuntimeError("disk full")
        return 0

    monkeypatch.setattr(round_one, "catch_up", catch_up)
    checker = Checker(_FakeServer())
    checker.wake("t")
    end = time.monotonic() + 5
    while (len(calls) < 1 or checker.backlog()) and time.monotonic() < end:
        time.sleep(0.01)
    checker.wake("t")
    while (len(calls) < 2 or checker.backlog()) and time.monotonic() < end:
        time.sleep(0.01)
    assert calls == ["t", "t"] and not checker.backlog()


def test_client_uploads_do_not_crash_a_server_whose_numba_threading_layer_is_not_threadsafe(tmp_path):
    # BUG (fixed in 77735fa): round one ran numba parallel kernels (`_sketch.sketch`) in the background worker on
    # every upload to a verified task. Numba's default layer where neither TBB nor OpenMP is
    # installed (workqueue; forced here) aborts the whole process on concurrent parallel launches,
    # so any client's upload during an analyst's query of another task (eval_sum, parallel), a
    # close's catch-up of another task, or the start-up warm-up kills the server (SIGABRT, every
    # in-flight request lost). Fix: serialize parallel kernel launches behind one process-wide
    # lock, or refuse to start without a thread-safe layer (NUMBA_THREADING_LAYER=threadsafe).
    p = Pair(tmp_path, env={"NUMBA_THREADING_LAYER": "workqueue"})
    try:
        grid = {"kind": "thresholds", "values": [float(v) for v in range(1000)]}
        plain, tok = create_task(p.urls, grid, 1.0, "tree", "substitution", min_batch=0, verify=False)
        submit(plain, np.arange(3000) % 1000, batch=3000)
        http("POST", f"{p.urls[0]}/tasks/{plain.task_id}/close", b"", tok)
        config, _ = create_task(p.urls, grid, 1.0, "tree", "substitution", min_batch=0)
        reports = [r.to_bytes() for r in make_reports(config, np.arange(3000) % 1000)]
        done = threading.Event()

        def client():
            try:
                for k in range(0, 3000, 200):
                    for u in p.urls:
                        post(u, config.task_id, reports[k:k + 200])
            except ServerError:
                pass
            finally:
                done.set()

        t = threading.Thread(target=client)
        t.start()
        analyst, end = Analyst(plain, tok), time.monotonic() + 20
        try:
            while not done.is_set() and time.monotonic() < end:
                analyst.prefix_counts(list(range(1000)))
        except ServerError:
            pass
        t.join()
        time.sleep(0.5)
        assert p.alive() == [True, True], "a server aborted (numba workqueue: concurrent parallel kernels)"
    finally:
        p.close()
