"""Review of verified round one on Dask (issue 24; `server.dask_check.RoundOneMap`): properties that
hold, pinned without a cluster. A stand-in client runs each submitted batch in this process when
its result is asked for (as a worker would, on the same pickled-free arguments), so what is pinned
is RoundOneMap's own bookkeeping: upload order, resumption after a failed batch or a restart, two
tasks at once, the challenges sent once per task, the drops' grid sum. (The bits a real worker
computes are pinned on a LocalCluster by tests/service/system/test_dask.py.)"""
from __future__ import annotations

import threading
from dataclasses import dataclass

import numpy as np
import pytest

from dpcdf.service.protocols.check import round_one
from dpcdf.service.protocols.context import StepContext
from dpcdf.service.server import dask_check
from dpcdf.service.storage.store import Store
from dpcdf.service.task import TaskConfig
from dpcdf.service.wire import join_share

GRID = {"kind": "thresholds", "values": [float(v) for v in range(50)]}
KEY, SEED, PARTY = bytes(range(32)), bytes(range(100, 132)), 1


class WorkerDied(RuntimeError):
    pass


class _Future:
    def __init__(self, client, fn, args):
        self.client, self.fn, self.args = client, fn, args

    def result(self):
        with self.client.guard:
            self.client.results += 1
            k = self.client.results
        if k in self.client.fail:
            raise WorkerDied("a worker died with this batch (KilledWorker)")
        return self.fn(*self.args)


class FakeClient:
    """`submit` and `scatter` as RoundOneMap uses them; the work runs at `result()`, and the
    results numbered in `fail` (from 1) raise instead."""

    def __init__(self, fail: range | tuple = ()):
        self.fail, self.results, self.guard = fail, 0, threading.Lock()
        self.scattered, self.submitted = [], 0

    def submit(self, fn, *args, pure=True):
        assert pure is False
        with self.guard:
            self.submitted += 1
        return _Future(self, fn, args)

    def scatter(self, obj, broadcast=False, hash=True):
        assert not hash
        if broadcast:  # the challenges (a batch's shares go to one worker)
            with self.guard:
                self.scattered.append(obj)
        return obj


@dataclass(frozen=True, eq=False)
class _OnCluster(StepContext):
    round_one_map: object = None


def _config(payload="count"):
    return TaskConfig(GRID, 1.0, "path", "substitution", 0, ("a", "b"), ("00" * 32, "01" * 32), "00", payload=payload)


def _shares(config, n, seed):
    rng = np.random.default_rng(seed)
    dcf, check = config.key_dcf(), config.check()
    width = check.width
    betas, *x = check.client_report(rng.integers(0, 2, (n, width)) if width == 2 else np.ones((n, 1), np.int64))
    keys = dcf.gen_batch(rng.integers(0, 50, n), betas)
    return [(rng.bytes(16), join_share(keys[PARTY][i].to_bytes(), x[PARTY][i])) for i in range(n)]


def _store(path, config):
    store = Store(path)
    store.add_task(config.task_id, config.to_json(), b"fp", SEED)
    return store


def _columns(store, task_id):
    rows = store.check_batches(task_id)
    assert all(a.last_seq < b.first_seq for a, b in zip(rows, rows[1:]))  # consecutive, never overlapping
    return {f: b"".join(getattr(b, f) for b in rows) for f in ("ids", "message", "state", "extras")}, sum(b.n for b in rows)


def _close(store, ctx, config, drop):
    store.freeze(config.task_id, lambda ids: str(len(ids)))
    store.exclude(config.task_id, drop, lambda ids: str(len(ids)))
    return round_one.prepare(ctx)


def _same(a, b):
    for field in ("ids", "context", "extras", "message", "state", "total"):
        np.testing.assert_array_equal(getattr(a, field), getattr(b, field))


@pytest.fixture
def small_batches(monkeypatch):
    monkeypatch.setattr(round_one, "keys_per_pass", lambda size, width: 32)
    monkeypatch.setattr(dask_check, "TASK_ELEMENTS", 40 * 50 * _config().key_dcf().width)  # 40 reports a batch


def _reference(tmp_path, config, items, drop):
    store = _store(tmp_path / "ref.sqlite", config)
    try:
        ctx = StepContext.of(config, PARTY, store, KEY)
        store.add_many(config.task_id, items)
        round_one.catch_up(ctx)
        return _columns(store, config.task_id), _close(store, ctx, config, drop)
    finally:
        store.close()


def test_a_failed_batch_then_a_restart_loses_and_double_counts_nothing(tmp_path, small_batches):
    """A batch's future fails (a worker died, KilledWorker) while later ones are in flight, and so
    does its second try: what was stored is a prefix in upload order, nothing after it; a fresh map
    (the server restarted) resumes from `checked_upto` and the close sees in-process's bits, every
    report exactly once."""
    config = _config()
    items = _shares(config, 300, 3)
    drop = [items[5][0], items[250][0]]
    (ref_cols, ref_n), ref_view = _reference(tmp_path, config, items, drop)
    store = _store(tmp_path / "dask.sqlite", config)
    try:
        base = StepContext.of(config, PARTY, store, KEY)
        store.add_many(config.task_id, items)
        failing = FakeClient(fail=range(3, 100))
        with pytest.raises(WorkerDied):
            round_one.catch_up(_OnCluster(*vars(base).values(), dask_check.RoundOneMap(failing, lambda: 2)))
        assert failing.submitted == 7  # AHEAD x 2 in flight, refilled after each of the two stored, the third again
        (cols, n) = _columns(store, config.task_id)
        assert n == 80 and store.checked_upto(config.task_id) == n  # the two batches before the failed one only
        assert ref_cols["message"].startswith(cols["message"]) and ref_cols["ids"].startswith(cols["ids"])
        restarted = FakeClient()
        ctx = _OnCluster(*vars(base).values(), dask_check.RoundOneMap(restarted, lambda: 2))
        assert round_one.catch_up(ctx) == 220
        assert round_one.catch_up(ctx) == 0  # caught up: a second run stores nothing
        assert _columns(store, config.task_id) == (ref_cols, ref_n) and ref_n == 300
        _same(_close(store, ctx, config, drop), ref_view)  # drops' grid sum on the "workers" too
        assert len(restarted.scattered) == 1
    finally:
        store.close()


def test_a_batch_lost_once_is_sent_again(tmp_path, small_batches):
    """A batch's shares are on one worker only (`RoundOneMap._submit`): when its future fails once
    (that worker died), the map sends the batch again and the run stores in-process's bits."""
    config = _config()
    items = _shares(config, 200, 8)
    (ref_cols, ref_n), _ = _reference(tmp_path, config, items, [])
    store = _store(tmp_path / "dask.sqlite", config)
    try:
        client = FakeClient(fail=(2,))
        ctx = _OnCluster(*vars(StepContext.of(config, PARTY, store, KEY)).values(), dask_check.RoundOneMap(client, lambda: 2))
        store.add_many(config.task_id, items)
        assert round_one.catch_up(ctx) == 200 and client.submitted == 5 + 1
        assert _columns(store, config.task_id) == (ref_cols, ref_n)
    finally:
        store.close()


def test_the_drops_grid_sum_keeps_ahead_batches_per_worker_in_flight(tmp_path, small_batches):
    """The close's drops (a client's reports to one server alone make them) go to the workers a window
    at a time, as round one's batches: all at once, every dropped share sat in the RAM spool and the
    server's memory together (review of issue 24). Same sum as in-process."""
    config = _config()
    items = _shares(config, 300, 5)
    store = _store(tmp_path / "dask.sqlite", config)
    try:
        store.add_many(config.task_id, items)
        client, in_flight = FakeClient(), []
        submit = client.submit
        client.submit = lambda fn, *a, pure=True: in_flight.append(client.submitted - client.results + 1) or submit(fn, *a, pure=pure)
        ctx = StepContext.of(config, PARTY, store, KEY)
        ids = [i for i, _ in items]
        got = dask_check.RoundOneMap(client, lambda: 2).grid_sum(ctx, ids)
        np.testing.assert_array_equal(got, round_one.grid_sum(ctx, ids))
        assert client.submitted == 8 and max(in_flight) == dask_check.AHEAD * 2  # 300 reports, 40 a batch
    finally:
        store.close()


def test_two_tasks_round_ones_at_once_on_one_map(tmp_path, small_batches):
    """Two tasks' round ones in two threads through one RoundOneMap (the checker and a close): each
    stores in-process's per-report bits; each task's challenges are scattered once, are that task's
    (`round_one.challenges` of K and its id), and differ between the tasks."""
    configs = [_config("count"), _config("label")]
    data = [_shares(c, 200, 10 + i) for i, c in enumerate(configs)]
    refs = [_reference(tmp_path / str(i), c, d, [])[0] for i, (c, d) in enumerate(zip(configs, data))
            if (tmp_path / str(i)).mkdir() is None]
    client = FakeClient()
    shared = dask_check.RoundOneMap(client, lambda: 2)
    store = Store(tmp_path / "both.sqlite")
    errors = []
    try:
        ctxs = []
        for c, d in zip(configs, data):
            store.add_task(c.task_id, c.to_json(), b"fp", SEED)
            store.add_many(c.task_id, d)
            ctxs.append(_OnCluster(*vars(StepContext.of(c, PARTY, store, KEY)).values(), shared))
        start = threading.Barrier(2)

        def run(ctx):
            try:
                start.wait()
                round_one.catch_up(ctx)
            except BaseException as exc:  # noqa: BLE001
                errors.append(exc)

        threads = [threading.Thread(target=run, args=(ctx,)) for ctx in ctxs]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors
        for c, ref in zip(configs, refs):
            assert _columns(store, c.task_id) == ref
        assert len(client.scattered) == 2
        expected = [round_one.challenges(c.check(), KEY, c.task_id) for c in configs]
        for ch in expected:
            assert any(ch is s for s in client.scattered)
        assert not np.array_equal(np.asarray(expected[0].s), np.asarray(expected[1].s))
    finally:
        store.close()


def test_a_purge_during_a_mapped_round_one_leaves_no_batch(tmp_path, small_batches, monkeypatch):
    """Review finding 3: batches computed on the workers while an operator's delete purges the task
    are not stored after it (they held report ids and round-one values)."""
    from dpcdf.service.storage import retention
    config = _config()
    store = _store(tmp_path / "dask.sqlite", config)
    try:
        store.add_many(config.task_id, _shares(config, 120, 4))
        real, calls = round_one.store_batch, []

        def purged_meanwhile(ctx, *a):
            if not calls:  # the operator's delete lands while the workers compute
                retention.purge(store, config.task_id, "deleted", tmp_path)
            calls.append(1)
            return real(ctx, *a)

        monkeypatch.setattr(round_one, "store_batch", purged_meanwhile)
        ctx = _OnCluster(*vars(StepContext.of(config, PARTY, store, KEY)).values(), dask_check.RoundOneMap(FakeClient(), lambda: 2))
        round_one.catch_up(ctx)
        assert len(calls) > 1 and store.check_batches(config.task_id) == []
    finally:
        store.close()


def test_a_worker_restart_does_not_break_the_task_s_round_one_for_good(tmp_path):
    """Review finding 2: once the workers holding a task's scattered challenges are gone, the next
    round one sends them again (it failed with 'lost dependencies' until the server restarted)."""
    import os
    import signal
    import time

    from dpcdf.service.server.dask_eval import DaskEvaluator
    ev = DaskEvaluator("local:1")
    try:
        assert ev.cluster.scheduler_address.startswith("tls://") and ev.round_one is not None  # review finding 1
        config = _config()
        items = _shares(config, 100, 5)
        store = _store(tmp_path / "s.sqlite", config)
        ctx = _OnCluster(*vars(StepContext.of(config, PARTY, store, KEY)).values(), ev.round_one)
        store.add_many(config.task_id, items[:50])
        assert round_one.catch_up(ctx) == 50
        before = ev.client.run(os.getpid)
        for pid in before.values():
            os.kill(pid, signal.SIGKILL)
        end = time.monotonic() + 60
        while True:
            try:
                now = ev.client.run(os.getpid)
                if now and set(now.values()).isdisjoint(before.values()):
                    break
            except Exception:  # noqa: BLE001 (the worker is coming back)
                pass
            assert time.monotonic() < end
            time.sleep(0.2)
        store.add_many(config.task_id, items[50:])
        assert round_one.catch_up(ctx) == 50
    finally:
        ev.close()


def test_a_plain_tcp_scheduler_gets_no_verified_round_one():
    """Review finding 1: the workers of verified round one hold the task's challenges, with which a
    client forges reports; on a tcp:// scheduler anyone who reaches it reads them, so round one stays
    in-process there (and the server refuses verified grids above 2^16 points)."""
    from distributed import LocalCluster

    from dpcdf.service.server.dask_eval import DaskEvaluator
    cluster = LocalCluster(n_workers=1, threads_per_worker=1, processes=False, protocol="tcp://", dashboard_address=None,
                           silence_logs=40)
    try:
        assert cluster.scheduler_address.startswith("tcp://")
        ev = DaskEvaluator(cluster.scheduler_address, insecure=True)  # plain tcp:// only on request (issue 42)
        try:
            assert ev.round_one is None
        finally:
            ev.close()
    finally:
        cluster.close()


def test_a_new_spool_removes_the_spools_of_dead_servers_only(tmp_path):
    """Round one's RAM spool holds key shares on their way to local workers: a server killed before it
    closed left them there, out of retention's reach. The next server's spool removes the spools whose
    lock nobody holds and leaves a live server's alone (its flock, whatever its pid namespace); links,
    files and folders without a lock in /dev/shm (anyone may write there) neither stop it nor are
    followed (review of issue 24: a dangling link stopped every local:N start)."""
    import fcntl
    import os

    from dpcdf.service.server import dask_eval

    live = dask_eval._spool(str(tmp_path))
    (live / "batch").write_bytes(b"key shares")
    dead = tmp_path / f"{dask_eval.SPOOL_PREFIX}dead"
    dead.mkdir()
    (dead / dask_eval.SPOOL_LOCK).write_bytes(b"")
    (dead / "batch").write_bytes(b"key shares")
    target = tmp_path / "elsewhere"
    target.mkdir()
    (tmp_path / f"{dask_eval.SPOOL_PREFIX}link").symlink_to(target)
    (tmp_path / f"{dask_eval.SPOOL_PREFIX}dangling").symlink_to(tmp_path / "nothing")
    (tmp_path / f"{dask_eval.SPOOL_PREFIX}{10**30}").mkdir()  # no lock: not judged
    new = dask_eval._spool(str(tmp_path))
    assert not dead.exists() and (live / "batch").exists() and target.exists()
    assert (tmp_path / f"{dask_eval.SPOOL_PREFIX}{10**30}").exists()
    assert new.parent == tmp_path and new.name.startswith(dask_eval.SPOOL_PREFIX) and new != live
    fd = os.open(new / dask_eval.SPOOL_LOCK, os.O_RDWR)
    try:
        with pytest.raises(OSError):  # held by its server
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    finally:
        os.close(fd)
    for spool in (live, new):
        dask_eval._release(spool)
    assert not live.exists() and not new.exists()
    assert dask_eval._spool(str(tmp_path / "none")) is None


def test_a_failed_secret_write_leaves_no_partial_file(tmp_path, monkeypatch):
    """A batch's spool file that cannot be written (a full /dev/shm) leaves no partial key shares."""
    import os

    from dpcdf.service import files

    def full(fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(OSError):
        files.write_secret(tmp_path / "batch", b"key shares" * 100)
    assert list(tmp_path.iterdir()) == []
