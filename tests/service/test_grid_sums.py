"""An unverified task's histogram share, summed in batches while its reports arrive (issue 44,
`dpcdf.service.protocols.grid_sums`, `dpcdf.service.server.histograms`): the same bits as today's
evaluation of the frozen set's key shares at every grid index (`Aggregator.grid_histogram`, the oracle
here), however the batches are cut and whoever computes them: with reports dropped by the reconciliation
inside and outside the stored batches, reports that reached one server only, a store reopened in the
middle of the collection, a close racing the uploads and the worker, a store restored from a backup
without its share; and none of it outlives a purge."""
from __future__ import annotations

import threading
from dataclasses import replace
from types import SimpleNamespace

import numpy as np
import pytest

from dpcdf.release.ecdf import prefix_counts
from dpcdf.service.protocols import grid_sums
from dpcdf.service.protocols.context import StepContext
from dpcdf.service.server.aggregate import Aggregator, Histogram, partial_sums
from dpcdf.service.server.state import Server
from dpcdf.service.storage import retention
from dpcdf.service.storage.backup import backup
from dpcdf.service.storage.records import CollectionClosed
from dpcdf.service.storage.store import Store
from dpcdf.service.task import TaskConfig, token_hash

GRID = {"kind": "uniform", "lo": 0.0, "hi": 1.0, "bits": 7}


def _config(payload: str = "count", **kw) -> TaskConfig:
    return TaskConfig(GRID, 1.0, "tree", "substitution", 0, ("a", "b"), ("00" * 32, "01" * 32), "00", payload=payload,
                      verify=False, **kw)


def _reports(config: TaskConfig, n: int, seed: int) -> tuple[list[bytes], list[list[bytes]], np.ndarray]:
    """n reports: their ids, each party's key shares (stored as an upload stores them) and indices."""
    rng = np.random.default_rng(seed)  # test data: values, payloads and ids
    dcf, size = config.dcf(), config.make_grid().size
    alphas = rng.integers(0, size, n)
    betas = rng.integers(0, 2, (n, dcf.width)) if dcf.width > 1 else 1
    keys = dcf.gen_batch(alphas, betas)
    return [rng.bytes(16) for _ in range(n)], [[keys[p][i].to_bytes() for i in range(n)] for p in (0, 1)], alphas


def oracle(store: Store, config: TaskConfig, party: int) -> np.ndarray:
    """Today's histogram share: the frozen set's key shares (excluded ones left out) evaluated at every grid index."""
    frozen, dcf = store.frozen(config.task_id), config.dcf()
    shares, _ = store.shares_since(config.task_id, 0, frozen.seq)
    agg = Aggregator(dcf, config.make_mechanism(), b"s" * 32, config.task_id, noise=False)
    return agg.grid_histogram([dcf.batch_from_keys(shares, party)] if shares else [], config.make_grid().size, frozen.digest).values


def _batches(store: Store, task_id: str) -> list[tuple[int, int, int]]:
    return [(b.first_seq, b.last_seq, b.n) for b in store.check_batches(task_id)]


def _open(path, config: TaskConfig) -> Store:
    store = Store(path)
    store.add_task(config.task_id, config.to_json(), config.fingerprint, b"s" * 32)
    return store


def _task(tmp_path, monkeypatch, per: int, n: int, seed: int, payload: str = "count", party: int = 0):
    """(config, ids, party's shares, store, context) of an unverified task with n reports made (none stored)
    and batches of `per` reports (at least its grid's size * width / 8)."""
    config = _config(payload)
    monkeypatch.setattr(grid_sums, "BATCH_VALUES", per * config.make_grid().size * config.dcf().width)
    ids, shares, _ = _reports(config, n, seed)
    store = _open(tmp_path / "server.sqlite", config)
    return config, ids, shares[party], store, StepContext.of(config, party, store, b"k" * 32)


@pytest.mark.parametrize("payload", ["count", "label"])
def test_batches_less_the_drops_are_the_frozen_sets_histogram_across_a_reopened_store(tmp_path, monkeypatch, payload):
    """Reports arrive in rounds between the worker's runs (other tasks' reports between them); only full
    batches are stored while collecting; the store is closed and reopened (a restart: its batches stay, the
    rest is caught up); the reconciliation drops reports inside stored batches and after them."""
    config, ids, shares, store, ctx = _task(tmp_path, monkeypatch, 40, 100, 1, payload, party=1)
    other, path, party = _config(payload), tmp_path / "server.sqlite", 1
    store.add_task(other.task_id, other.to_json(), other.fingerprint, b"s" * 32)
    per = grid_sums.ring_sums(ctx).per_batch
    assert per == 40
    for lo, hi in ((0, 5), (5, 45), (45, 85)):
        store.add_many(config.task_id, [(ids[i], shares[i]) for i in range(lo, hi)])
        store.add_many(other.task_id, [(i.to_bytes(16, "big"), shares[0]) for i in range(lo, hi)])
        grid_sums.catch_up(ctx)
    assert [n for _, _, n in _batches(store, config.task_id)] == [40, 40]  # 80 of 85: full batches only while collecting
    store.close()
    store = _open(path, config)  # restarted: the batches are there, the rest is not
    ctx = StepContext.of(config, party, store, b"k" * 32)
    assert sum(n for _, _, n in _batches(store, config.task_id)) == 80
    store.add_many(config.task_id, [(ids[i], shares[i]) for i in range(85, 100)])
    store.freeze(config.task_id, lambda got: "set")
    drops = [ids[3], ids[50], ids[82], ids[99]]  # in both stored batches, and in none yet
    store.exclude(config.task_id, drops, lambda got: f"set of {len(got)}")
    store.mark(config.task_id, "reconciled")
    got = grid_sums.histogram(ctx)
    want = oracle(store, config, party)
    assert got.dtype == np.uint64 and got.shape == want.shape == (config.make_grid().size, config.dcf().width)
    np.testing.assert_array_equal(got, want)
    batches = _batches(store, config.task_id)
    assert sum(n for _, _, n in batches) == 100 and all(a[1] < b[0] for a, b in zip(batches, batches[1:]))
    assert sum(n for _, _, n in _batches(store, other.task_id)) == 0  # the other task's reports are its own
    assert not np.array_equal(got, grid_sums.total(store.check_batches(config.task_id), grid_sums.ring_sums(ctx), [],
                                                   lambda _: None)[0])  # the drops' values did come off
    store.close()


def test_a_close_racing_the_uploads_and_the_worker_sums_exactly_the_frozen_set(tmp_path, monkeypatch):
    config, ids, shares, store, ctx = _task(tmp_path, monkeypatch, 16, 4000, 2)
    stop, errors = threading.Event(), []

    def upload():
        for start in range(0, len(ids), 5):
            try:
                store.add_many(config.task_id, [(ids[i], shares[i]) for i in range(start, start + 5)])
            except CollectionClosed:
                return

    def worker():
        try:
            while not stop.is_set():
                grid_sums.catch_up(ctx)
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=upload), threading.Thread(target=worker)]
    for t in threads:
        t.start()
    while store.count(config.task_id) < 300:
        pass
    store.freeze(config.task_id, lambda got: "set")
    threads[0].join()
    stop.set()
    threads[1].join()
    assert not errors
    stored = store.count(config.task_id)
    assert 300 <= stored < 4000  # the close did race the uploads
    store.mark(config.task_id, "reconciled")
    np.testing.assert_array_equal(grid_sums.histogram(ctx), oracle(store, config, 0))
    assert sum(n for _, _, n in _batches(store, config.task_id)) == stored
    store.close()


def test_a_purge_keeps_no_batch_or_share_and_stores_none_made_meanwhile(tmp_path, monkeypatch):
    config, ids, shares, store, ctx = _task(tmp_path, monkeypatch, 20, 30, 3)
    store.add_many(config.task_id, [(ids[i], shares[i]) for i in range(20)])
    assert grid_sums.catch_up(ctx) == 20 and store.checked_count(config.task_id) == 20
    store.add_many(config.task_id, [(ids[i], shares[i]) for i in range(20, 30)])
    store.mark_purged(config.task_id, "expired")  # the purge's first transaction; its report rows go after
    assert store.checked_count(config.task_id) == 0
    assert grid_sums.catch_up(ctx) == 0 and store.checked_count(config.task_id) == 0  # nothing stored, no spin
    assert not store.save_histogram(config.task_id, "set", (128, 1), bytes(1024)) and store.histogram(config.task_id) is None
    retention.purge(store, config.task_id, "deleted", tmp_path)
    assert store.count(config.task_id) == 0 and store.check_batches(config.task_id) == []
    store.close()


def test_only_small_grids_of_unverified_tasks_are_summed_in_batches():
    def sums(config):
        return grid_sums.ring_sums(SimpleNamespace(config=config))  # it reads the context's config only

    assert sums(_config()).per_batch == grid_sums.MAX_BATCH == 1 << 16  # 2^7 points: at most 2^16 reports a batch
    assert sums(replace(_config(), grid={**GRID, "bits": 10})).per_batch == 1 << 14  # 2^24 grid values
    big = TaskConfig({"kind": "uniform", "lo": 0.0, "hi": 1.0, "bits": 16}, 1.0, "path", "substitution", 0, ("a", "b"),
                     ("00" * 32, "01" * 32), "00", payload="label", verify=False)
    assert sums(big).per_batch == 2 * (1 << 16) // 8  # 64 B of sums a report
    above = TaskConfig({"kind": "uniform", "lo": 0.0, "hi": 1.0, "bits": 17}, 1.0, "path", "substitution", 0, ("a", "b"),
                       ("00" * 32, "01" * 32), "00", verify=False)
    assert sums(above) is None
    verified = TaskConfig(GRID, 1.0, "tree", "substitution", 0, ("a", "b"), ("00" * 32, "01" * 32), "00")
    assert verified.verify and sums(verified) is None


@pytest.fixture
def two(tmp_path, monkeypatch):
    """Two in-process servers (their background workers running) and an unverified task on both."""
    monkeypatch.setenv("DPCDF_ADMIN_TOKEN", "x" * 20)
    monkeypatch.setattr(grid_sums, "BATCH_VALUES", 32 * 128)  # 32 reports a batch
    servers = [Server(p, tmp_path / f"s{p}", noise=False) for p in (0, 1)]
    keys = (servers[0].keys.public_hex("x25519"), servers[1].keys.public_hex("x25519"))
    config = TaskConfig(GRID, 1.0, "tree", "substitution", 2, ("http://a", "http://b"), keys, token_hash("t"), verify=False)
    for srv in servers:
        srv.register(config)
    yield servers, config
    for srv in servers:
        srv.close()


def _settle(servers) -> None:
    for srv in servers:
        while srv.checker.backlog():
            threading.Event().wait(0.01)


def test_the_close_stores_each_servers_share_and_every_query_reads_it(two, tmp_path):
    """A close between two in-process servers (server 0's messages posted to server 1's state): reports on
    both, two on server 0 only and one on server 1 only (dropped by the reconciliation). Each server stores
    its share of the reconciled set, bit for bit the oracle's; queries read it; the two add up to the exact
    counts. A backup taken before the share was stored (its row deleted from the copy) still answers: the
    restored server makes it again from the batches, the same bits."""
    servers, config = two
    ids, shares, alphas = _reports(config, 150, 4)
    states = [srv.task(config.task_id) for srv in servers]
    for srv, st in zip(servers, states):
        p = srv.party
        srv.add_reports(st, [(ids[i], shares[p][i]) for i in range(100)])
        srv.add_reports(st, [(ids[i], shares[p][i]) for i in ((100, 101) if p == 0 else (102,))])  # one-sided
        srv.add_reports(st, [(ids[i], shares[p][i]) for i in range(103, 150)])
    _settle(servers)
    assert all(srv.store.checked_count(config.task_id) == 128 for srv in servers)  # 4 full batches of 32 each

    def post(path, message):
        return states[1].answer_sync(message)

    view = states[0].close(post)
    assert view["n"] == 147
    kept = np.delete(np.arange(150), [100, 101, 102])
    answers = []
    for srv, st in zip(servers, states):
        row = srv.store.histogram(config.task_id)
        assert row is not None and row[0] == view["reports_hash"]
        want = oracle(srv.store, config, srv.party)
        np.testing.assert_array_equal(np.frombuffer(row[2], "<u8").reshape(row[1]), want)
        source, n, _ = st.open_for_query([])
        assert isinstance(source, Histogram) and n == 147
        np.testing.assert_array_equal(source.values, want)
        answers.append(st.aggregator.prefix_shares(source, np.arange(128)))
    counts = (answers[0] + answers[1]).view(np.int64)
    values = config.make_grid().thresholds[alphas[kept]]  # a value at each report's index
    np.testing.assert_array_equal(counts, prefix_counts(values, config.make_grid()))
    backup(tmp_path / "s1", tmp_path / "b1")
    copy = Store(tmp_path / "b1" / "server.sqlite")
    copy.db.execute("DELETE FROM histograms")
    copy.close()
    restored = Server(1, tmp_path / "b1", noise=False)
    try:
        st = restored.task(config.task_id)
        source, n, digest = st.open_for_query([])
        assert n == 147 and digest == view["reports_hash"]
        np.testing.assert_array_equal(source.values, oracle(servers[1].store, config, 1))
        assert restored.store.histogram(config.task_id)[0] == digest  # stored again
    finally:
        restored.close()


def test_a_server_with_an_evaluator_makes_the_share_at_the_close_on_it_and_stores_no_batch(two):
    """`dpcdf serve --dask`: the unverified task's reports are not summed in batches here; the close makes
    the share with one pass of the evaluator over the segments (`Aggregator.grid_histogram`), the same bits."""
    servers, config = two
    calls = []

    def evaluator(dcf, shards, points):
        calls.append(len(points))
        return partial_sums(dcf, shards, points)

    servers[0].evaluator = evaluator  # before the task's state is built, as `Server.__init__` sets it
    ids, shares, _ = _reports(config, 100, 5)
    states = [srv.task(config.task_id) for srv in servers]
    servers[0].evaluator = None  # (the fixture's close would close it)
    assert not states[0].ctx.batched and states[1].ctx.batched
    for srv, st in zip(servers, states):
        srv.add_reports(st, [(ids[i], shares[srv.party][i]) for i in range(100)])
    _settle(servers)
    assert [srv.store.checked_count(config.task_id) for srv in servers] == [0, 96]  # three full batches on server 1
    states[0].close(lambda path, message: states[1].answer_sync(message))
    assert calls == [128]  # one pass over every grid index, at the close
    for srv, st in zip(servers, states):
        source, n, _ = st.open_for_query([])
        assert n == 100 and isinstance(source, Histogram)
        np.testing.assert_array_equal(source.values, oracle(srv.store, config, srv.party))
    assert calls == [128] and servers[0].store.checked_count(config.task_id) == 0
