"""An unverified task's histogram share on real servers (issue 44, `protocols.grid_sums`): summed in
batches while the reports arrive, through a server killed and restarted in the middle of the
collection, reports that reached one server only and uploads racing the close; each server's stored
share is bit for bit its frozen set's key shares evaluated at every grid index (today's
`Aggregator.grid_histogram`), and the queries, the first one included, read it."""
from __future__ import annotations

import sqlite3
import threading

import numpy as np
import pytest

from dpcdf.release.ecdf import prefix_counts
from dpcdf.service.client import create_task, make_reports, submit
from dpcdf.service.client.analyst import Analyst
from dpcdf.service.http import ServerError
from dpcdf.service.protocols import grid_sums
from dpcdf.service.server.aggregate import Aggregator
from helpers import values
from test_round_one_on_servers import Pair, consecutive, post, settled

GRID = {"kind": "uniform", "lo": 0.0, "hi": 100.0, "bits": 13}  # 2048 reports a batch (BATCH_VALUES / 2^13)


@pytest.fixture
def pair(tmp_path):
    p = Pair(tmp_path)
    yield p
    p.close()


def _rows(db, task_id: str) -> tuple[list[int], tuple | None, list[bytes], int]:
    """(the stored batches' sizes, the histogram row, the frozen set's key shares in order, the party's
    count of the task's stored reports), read from a server's store."""
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        sizes = [n for (n,) in con.execute("SELECT n FROM check_batches WHERE task_id = ? ORDER BY first_seq", (task_id,))]
        hist = con.execute("SELECT set_hash, shape, data FROM histograms WHERE task_id = ?", (task_id,)).fetchone()
        frozen = con.execute("SELECT frozen_seq FROM tasks WHERE task_id = ?", (task_id,)).fetchone()[0]
        shares = [bytes(r[0]) for r in con.execute("SELECT key_share FROM counted WHERE task_id = ? AND seq <= ? ORDER BY seq",
                                                   (task_id, frozen or 0))]
        count = con.execute("SELECT count(*) FROM reports WHERE task_id = ?", (task_id,)).fetchone()[0]
    finally:
        con.close()
    return sizes, hist, shares, count


def test_shares_summed_through_a_restart_one_sided_reports_and_a_racing_close(pair):
    config, token = create_task(pair.urls, GRID, 1.0, "tree", "substitution", min_batch=0, verify=False)
    assert not config.verify and grid_sums.RingSums(config.dcf(), 1 << 13).per_batch == 2048
    vals = list(values(2500, 41))
    submit(config, vals, batch=500)
    lost = make_reports(config, [7.0, 70.0])  # one report reached server 0 only, another server 1 only
    assert post(pair.urls[0], config.task_id, [lost[0].to_bytes()])["accepted"] == 1
    assert post(pair.urls[1], config.task_id, [lost[1].to_bytes()])["accepted"] == 1
    settled(pair.urls)
    assert [_rows(pair.db(p), config.task_id)[0] for p in (0, 1)] == [[2048], [2048]]  # full batches only, so far
    pair.kill(1)  # its batch is stored; the 453 reports after it are not in one
    pair.restart(1)
    more = list(values(2000, 42))
    submit(config, more, batch=500)
    vals += more
    settled(pair.urls)
    assert [_rows(pair.db(p), config.task_id)[0] for p in (0, 1)] == [[2048, 2048], [2048, 2048]]
    racing = [make_reports(config, values(50, 43 + k)) for k in range(40)]
    both, stop = [], threading.Event()

    def upload():  # batches of 50, to server 0 then to server 1, until one of them is closed
        for k, batch in enumerate(racing):
            try:
                post(pair.urls[0], config.task_id, [r.to_bytes() for r in batch])
                post(pair.urls[1], config.task_id, [r.to_bytes() for r in batch])
            except ServerError as exc:
                assert exc.status == 409
                return
            both.append(k)
            if len(both) == 2:
                stop.set()
        stop.set()

    uploading = threading.Thread(target=upload)
    uploading.start()
    stop.wait(60)
    analyst = Analyst(config, token)
    n = analyst.close()
    uploading.join()
    assert len(both) < len(racing)  # the close did race the uploads
    vals += [v for k in both for v in values(50, 43 + k)]
    assert n == len(vals)
    for party in (0, 1):
        sizes, hist, shares, count = _rows(pair.db(party), config.task_id)
        assert sum(sizes) == count  # after the close, every stored report is in exactly one batch
        consecutive(pair.db(party), config.task_id)
        dcf = config.dcf()
        want = Aggregator(dcf, config.make_mechanism(), b"s" * 32, config.task_id, noise=False).grid_histogram(
            [dcf.batch_from_keys(shares, party)], 1 << 13, "").values
        assert len(shares) == n and hist is not None and hist[1] == "8192,1"
        np.testing.assert_array_equal(np.frombuffer(hist[2], "<u8"), want[:, 0])  # the same bits as today's evaluation
    idx = list(range(0, 1 << 13, 7))
    counts, got = analyst.prefix_counts(idx)  # the first query: from the stored shares
    assert got == n
    np.testing.assert_array_equal(counts, prefix_counts(np.asarray(vals, float), config.make_grid())[idx])
