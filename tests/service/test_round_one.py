"""Round one of the report check while reports arrive (`dpcdf.service.protocols.check.round_one`): the servers store
it batch by batch during the collection, the close reads it back (leaving out what the
reconciliation dropped), and however the batches are cut or whoever computes them, every report is
in exactly one batch and the close sees what a computation from scratch gives."""
from __future__ import annotations

import sqlite3
import threading
import time

import numpy as np

from dpcdf.release.ecdf import prefix_counts
from dpcdf.service.protocols.check import round_one
from dpcdf.service.verification import sketch
from dpcdf.service.client.analyst import Analyst
from dpcdf.service.client import create_task, make_reports, submit
from dpcdf.service.http import http
from dpcdf.service.protocols.context import StepContext
from dpcdf.service.storage.store import Store
from dpcdf.service.task import TaskConfig
from dpcdf.service.wire import encode_batch, join_share
from helpers import OPERATOR, urls, values

GRID = {"kind": "thresholds", "values": [float(v) for v in range(50)]}
KEY = bytes(range(32))


def settled(config: TaskConfig, timeout: float = 120.0) -> None:
    """Waits until neither server has round-one work queued or running."""
    end = time.monotonic() + timeout
    while any(http("GET", f"{u}/health/operator", token=OPERATOR)["checking"] for u in config.servers):
        assert time.monotonic() < end, "round one did not finish"
        time.sleep(0.1)


def batches(data_dir, task_id: str) -> list[tuple[int, int, int]]:
    db = sqlite3.connect(f"file:{data_dir}/server.sqlite?mode=ro", uri=True)
    try:
        return db.execute("SELECT first_seq, last_seq, n FROM check_batches WHERE task_id = ? ORDER BY first_seq", (task_id,)).fetchall()
    finally:
        db.close()


def test_round_one_runs_during_the_collection_and_the_close_leaves_out_a_one_sided_report(servers):
    procs, _ = servers
    pair = procs["exact"]
    config, token = create_task(urls(pair), GRID, 1.0, "tree", "substitution", min_batch=0)
    assert config.verify
    vals = values(400, 21) % 49.0
    submit(config, vals, batch=100)
    lost = make_reports(config, [3.0, 44.0])  # a client that crashed after its upload to server 0
    res = http("POST", f"{config.servers[0]}/tasks/{config.task_id}/reports/batch", encode_batch([r.to_bytes() for r in lost]),
               content_type="application/octet-stream")
    assert res["accepted"] == 2
    settled(config)
    for party, expected in ((0, 402), (1, 400)):
        stored = batches(pair[party][2], config.task_id)
        assert sum(n for _, _, n in stored) == expected  # before the close, every report is in a batch
        assert all(a[1] < b[0] for a, b in zip(stored, stored[1:]))  # consecutive, never overlapping
    view = http("POST", f"{config.servers[0]}/tasks/{config.task_id}/close", b"", token)
    assert view["n"] == 400 and view["rejected"] == {}
    counts, n = Analyst(config, token).prefix_counts(list(range(50)))
    np.testing.assert_array_equal(counts, prefix_counts(vals, config.make_grid()))  # the drops' grid values subtracted


def shares(config: TaskConfig, n: int, party: int, seed: int) -> list[tuple[bytes, bytes]]:
    """(report id, stored share) of n honest reports for `party` (the layout `wire.split_share` reads)."""
    rng = np.random.default_rng(seed)  # which values and ids, not key randomness
    dcf, check = config.key_dcf(), config.check()
    betas, *x = check.client_report(np.ones((n, 1), np.int64))
    keys = dcf.gen_batch(rng.integers(0, 50, n), betas)
    return [(rng.bytes(16), join_share(keys[party][i].to_bytes(), x[party][i])) for i in range(n)]


def test_batches_are_stored_once_whoever_computes_them_and_prepare_matches_a_fresh_computation(tmp_path):
    config = TaskConfig(GRID, 1.0, "path", "substitution", 0, ("a", "b"), ("00" * 32, "01" * 32), "00")
    task, party = config.task_id, 1
    store = Store(tmp_path / "server.sqlite")
    try:
        store.add_task(task, config.to_json(), b"fp", b"seed")
        other = "other"
        store.add_task(other, config.to_json(), b"fp", b"seed")
        items = shares(config, 300, party, 5)
        for start in range(0, 300, 37):  # uploads interleaved with another task's
            store.add_many(task, items[start:start + 37])
            store.add_many(other, [(bytes([start % 256]) * 16, items[0][1])])
        errors = []
        ctx = StepContext.of(config, party, store, KEY)

        def run(limit: int) -> None:
            try:
                while round_one.step(ctx, limit):
                    pass
            except Exception as exc:  # noqa: BLE001 - reported below
                errors.append(exc)

        threads = [threading.Thread(target=run, args=(k,)) for k in (7, 19, 64)]  # racing, differently cut
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors
        stored = store.check_batches(task)
        ids = b"".join(b.ids for b in stored)
        assert ids == b"".join(rid for rid, _ in items)  # each report in exactly one batch, in upload order
        store.freeze(task, lambda ids: str(len(ids)))
        store.exclude(task, [items[5][0], items[200][0]], lambda ids: str(len(ids)))  # the reconciliation's drops
        local = round_one.prepare(ctx)
        kept = sorted((rid, share) for rid, share in items if rid not in (items[5][0], items[200][0]))
        assert local.ids == [rid for rid, _ in kept]
        batch, x = round_one.decode_shares(config.key_dcf(), config.check().extras, [s for _, s in kept], party)
        y = round_one.grid_values(config.key_dcf(), batch, 50)
        check = config.check()
        msg, st = check.round_one(party, y, x, round_one.challenges(check, KEY, task))
        np.testing.assert_array_equal(local.message, msg)
        np.testing.assert_array_equal(local.state, st)
        np.testing.assert_array_equal(local.extras, x)
        np.testing.assert_array_equal(local.total, sketch.column_sums(round_one.data(check, y)))  # without the MAC tags
    finally:
        store.close()
