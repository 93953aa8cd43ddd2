"""The client's spool: a report, once made, is the same bytes forever; a re-run sends only what a
server has not acknowledged; a spool for another task or input is refused."""

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from dpcdf.errors import DpcdfError
from dpcdf.service.spool import Spool, SpoolBusy, SpoolMismatch
from dpcdf.service.client import create_task, submit
from dpcdf.service.http import http
from helpers import GRID, urls, values

FP = b"f" * 32


def _fill(spool: Spool, start: int, stop: int) -> None:
    spool.add(start, [(i.to_bytes(16, "little"), b"report %d" % i) for i in range(start, stop)])


def test_a_spool_for_another_task_or_input_is_refused(tmp_path):
    path, vals = tmp_path / "s.spool", np.arange(5.0)
    Spool.open(path, FP, vals).close()
    with pytest.raises(SpoolMismatch, match="another task"):
        Spool.open(path, b"g" * 32, vals)
    with pytest.raises(SpoolMismatch, match="another input"):
        Spool.open(path, FP, vals + 1e-9)  # one changed value is another input
    with pytest.raises(SpoolMismatch, match="another input"):
        Spool.open(path, FP, vals, labels=np.array([0, 1, 0, 1, 0]))
    assert issubclass(SpoolMismatch, DpcdfError)
    assert (path.stat().st_mode & 0o777) == 0o600  # sealed reports only, but nobody else's business
    Spool.open(path, FP, vals.copy()).close()  # the same input opens


def test_a_spool_in_use_by_another_upload_is_refused_until_it_ends(tmp_path):
    path, vals = tmp_path / "s.spool", np.arange(3.0)
    first = Spool.open(path, FP, vals)
    with pytest.raises(SpoolBusy, match="in use by another upload"):
        Spool.open(path, FP, vals)
    (tmp_path / "link.spool").symlink_to(path)
    with pytest.raises(SpoolBusy):  # the same file under another name is the same spool
        Spool.open(tmp_path / "link.spool", FP, vals)
    first.close()
    Spool.open(path, FP, vals).close()
    with pytest.raises(SpoolMismatch):
        Spool.open(path, FP, vals[:2])
    Spool.open(path, FP, vals).close()  # a refused open released its lock


@settings(max_examples=30)
@given(n=st.integers(1, 40), made=st.integers(0, 40), acks=st.lists(st.tuples(st.integers(0, 39), st.integers(0, 1), st.booleans()), max_size=60))
def test_status_counts_rows_by_what_each_server_said(tmp_path_factory, n, made, acks):
    made = min(made, n)
    spool = Spool.open(tmp_path_factory.mktemp("s") / "s.spool", FP, np.arange(float(n)))
    _fill(spool, 0, made)
    said: dict = {}
    for row, party, ok in acks:
        if row < made:
            spool.record(party, [row] if ok else [], {} if ok else {row: "bad"})
            said[row, party] = ok
    s = spool.status()
    complete = sum(1 for r in range(made) if said.get((r, 0)) is True and said.get((r, 1)) is True)
    rejected = sum(1 for r in range(made) if False in (said.get((r, 0)), said.get((r, 1))))
    assert (s.rows, s.spooled, s.complete, s.rejected, s.pending) == (n, made, complete, rejected, n - complete - rejected)
    for party in (0, 1):
        pending = [r for r, _ in spool.unacknowledged(party, 1000)]
        assert pending == [r for r in range(made) if (r, party) not in said]


def test_reports_are_made_once_and_survive_reopening(tmp_path):
    path, vals = tmp_path / "s.spool", np.arange(10.0)
    spool = Spool.open(path, FP, vals)
    _fill(spool, 0, 4)
    spool.close()
    spool = Spool.open(path, FP, vals)  # a crash while making reports: the made prefix is kept
    assert spool.spooled() == 4
    before = spool.unacknowledged(0, 100)
    _fill(spool, 4, 10)
    assert spool.unacknowledged(0, 100)[:4] == before
    with pytest.raises(SpoolBusy, match="another process"):
        _fill(spool, 3, 4)  # a row is never made twice


def test_rerunning_submit_sends_nothing_twice_and_makes_no_new_report(servers, tmp_path):
    procs, _ = servers
    pair = urls(procs["exact"])
    config, token = create_task(pair, GRID, 1.0, "path", "substitution", min_batch=1)
    vals = values(120, 31)
    path = tmp_path / "r.spool"
    first = submit(config, vals, batch=50, spool=path)
    assert first == {"reports": 120, "complete": 120, "pending": 0, "rejected": 0, "spool": str(path)}
    spool = Spool.open(path, config.fingerprint, vals)
    assert spool.unacknowledged(0, 1000) == spool.unacknowledged(1, 1000) == []  # all acknowledged
    spool.close()
    assert submit(config, vals, batch=50, spool=path) == first  # a re-run: nothing to send
    for url in pair:
        assert http("GET", f"{url}/tasks/{config.task_id}", token=token)["reports"] == 120
    with pytest.raises(SpoolMismatch):
        submit(config, vals[:-1], spool=path)
