"""The client's spool: a report, once made, is the same bytes forever; a re-run sends only what a
server has not acknowledged; a spool for another task or input is refused."""

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from dpcdf.errors import DpcdfError
from dpcdf.service.client.spool import DuplicateRows, Spool, SpoolBusy, SpoolMismatch
from dpcdf.service.client import create_task, submit
from dpcdf.service.http import http
from helpers import GRID, urls, values

FP = b"f" * 32


def _fill(spool: Spool, start: int, stop: int, source: str = "in") -> None:
    """Spools rows start..stop-1 of an input whose row i is the value i."""
    digests = spool.digests(np.arange(float(stop)))
    admitted = spool.admit(digests, source)
    spool.add(admitted, [(int(i).to_bytes(16, "little"), b"report %d" % i, digests[i], i + 1) for i in admitted.new[admitted.new >= start]])


def test_a_spool_for_another_task_is_refused_and_private(tmp_path):
    path = tmp_path / "s.spool"
    Spool.open(path, FP).close()
    with pytest.raises(SpoolMismatch, match="another task"):
        Spool.open(path, b"g" * 32)
    assert issubclass(SpoolMismatch, DpcdfError) and issubclass(DuplicateRows, DpcdfError)
    assert (path.stat().st_mode & 0o777) == 0o600  # sealed reports and row digests: nobody else's business
    Spool.open(path, FP).close()
    (tmp_path / "junk.spool").write_bytes(b"not sqlite at all" * 100)
    with pytest.raises(SpoolMismatch, match="not a dpcdf spool"):
        Spool.open(tmp_path / "junk.spool", FP)


def test_a_spool_in_use_by_another_upload_is_refused_until_it_ends(tmp_path):
    path = tmp_path / "s.spool"
    first = Spool.open(path, FP)
    with pytest.raises(SpoolBusy, match="in use by another upload"):
        Spool.open(path, FP)
    (tmp_path / "link.spool").symlink_to(path)
    with pytest.raises(SpoolBusy):  # the same file under another name is the same spool
        Spool.open(tmp_path / "link.spool", FP)
    first.close()
    Spool.open(path, FP).close()
    with pytest.raises(SpoolMismatch):
        Spool.open(path, b"h" * 32)
    Spool.open(path, FP).close()  # a refused open released its lock


def test_admit_knows_rows_by_content_per_source(tmp_path):
    spool = Spool.open(tmp_path / "s.spool", FP)
    vals = np.array([5.0, 7.0, 7.0, 9.0])
    _fill(spool, 0, 0)
    d = spool.digests(vals)
    first = spool.admit(d, "a.csv", [2, 3, 4, 5])
    assert first.new.tolist() == [0, 1, 2, 3] and first.spooled == 0  # equal rows in one input are two rows
    spool.add(first, [(bytes([i]) * 16, b"r", d[i], i + 2) for i in first.new])
    again = spool.admit(d, "a.csv")
    assert again.new.tolist() == [] and again.spooled == 4  # the same input: nothing new
    longer = spool.digests(np.append(vals, [7.0, 1.0]))
    grown = spool.admit(longer, "a.csv")
    assert grown.new.tolist() == [4, 5] and grown.spooled == 4 and not grown.new_version  # an extension
    with pytest.raises(DuplicateRows, match=r"all 4 of the 4 rows of b.csv .*\(lines 2-5 equal lines 2-5 of a.csv\)") as caught:
        spool.admit(d, "b.csv", [2, 3, 4, 5])  # the same rows under another name
    assert caught.value.rows == [(2, "a.csv", 2), (3, "a.csv", 3), (4, "a.csv", 4), (5, "a.csv", 5)]
    allowed = spool.admit(d, "b.csv", allow_duplicates=True)
    assert allowed.new.tolist() == [0, 1, 2, 3] and len(allowed.duplicates) == 4
    other = spool.admit(spool.digests(np.array([1.0, 2.0])), "b.csv")
    assert other.new.tolist() == [0, 1]  # other rows from another input: welcome
    changed = spool.digests(np.array([5.0, 7.0, 8.0]))  # a.csv lost rows: a new version of it
    with pytest.raises(DuplicateRows, match="as spooled before"):
        spool.admit(changed, "a.csv")
    assert spool.admit(d, "a.csv").spooled == 4  # restored: the first version again, not a duplicate of itself
    labelled = spool.digests(vals, labels=np.array([0, 1, 0, 1]))
    assert spool.admit(labelled, "b.csv").new.size == 4  # a label is part of the row
    contents = spool.digests(vals, contents=[b"1", b"2", b"3", b"4"])
    assert spool.admit(contents, "c.csv").new.size == 4  # so is the rest of a CSV row (another person's id)


@settings(max_examples=30)
@given(n=st.integers(1, 40), made=st.integers(0, 40), acks=st.lists(st.tuples(st.integers(0, 39), st.integers(0, 1), st.booleans()), max_size=60))
def test_status_counts_rows_by_what_each_server_said(tmp_path_factory, n, made, acks):
    made = min(made, n)
    spool = Spool.open(tmp_path_factory.mktemp("s") / "s.spool", FP)
    _fill(spool, 0, made)
    said: dict = {}
    for row, party, ok in acks:
        if row < made:
            spool.record(party, [row] if ok else [], {} if ok else {row: "bad"})
            said[row, party] = ok
    s = spool.status()
    complete = sum(1 for r in range(made) if said.get((r, 0)) is True and said.get((r, 1)) is True)
    rejected = sum(1 for r in range(made) if False in (said.get((r, 0)), said.get((r, 1))))
    assert (s.rows, s.spooled, s.complete, s.rejected, s.pending) == (made, made, complete, rejected, made - complete - rejected)
    for party in (0, 1):
        pending = [r for r, _ in spool.unacknowledged(party, 1000)]
        assert pending == [r for r in range(made) if (r, party) not in said]


def test_reports_are_made_once_and_survive_reopening(tmp_path):
    path = tmp_path / "s.spool"
    spool = Spool.open(path, FP)
    _fill(spool, 0, 4)
    spool.close()
    spool = Spool.open(path, FP)  # a crash while making reports: the made rows are kept
    assert spool.spooled() == 4
    before = spool.unacknowledged(0, 100)
    _fill(spool, 4, 10)
    assert spool.unacknowledged(0, 100)[:4] == before and spool.spooled() == 10
    _fill(spool, 0, 10)  # the whole input again: nothing is made twice
    assert spool.spooled() == 10


def test_rerunning_submit_sends_nothing_twice_and_makes_no_new_report(servers, tmp_path):
    procs, _ = servers
    pair = urls(procs["exact"])
    config, token = create_task(pair, GRID, 1.0, "path", "substitution", min_batch=1)
    vals = values(120, 31)
    path = tmp_path / "r.spool"
    first = submit(config, vals, batch=50, spool=path)
    assert {k: first[k] for k in ("rows", "new", "already_spooled", "reports", "complete", "pending", "rejected", "spool")} == {
        "rows": 120, "new": 120, "already_spooled": 0, "reports": 120, "complete": 120, "pending": 0, "rejected": 0,
        "spool": str(path)}
    spool = Spool.open(path, config.fingerprint)
    assert spool.unacknowledged(0, 1000) == spool.unacknowledged(1, 1000) == []  # all acknowledged
    spool.close()
    again = submit(config, vals, batch=50, spool=path)  # a re-run: nothing to make, nothing to send
    assert (again["new"], again["already_spooled"], again["complete"]) == (0, 120, 120)
    for url in pair:
        assert http("GET", f"{url}/tasks/{config.task_id}", token=token)["reports"] == 120
    with pytest.raises(DuplicateRows):
        submit(config, vals[:-1], spool=path, source="elsewhere")
    assert submit(config, vals[:-1], spool=path)["new"] == 0  # a part of what was sent, from the same place


def test_key_bytes_of_a_batch_are_each_keys_own_bytes():
    from fss import DCF

    from dpcdf.service.client import key_bytes

    for dcf in (DCF(6, 64, 1, cmp="ge"), DCF(6, width=3, cmp="ge", group="p61")):
        k0, k1 = dcf.gen_batch(np.arange(20) % 64, 1 if dcf.width == 1 else np.ones((20, 3), np.int64))
        for batch in (k0, k1):
            assert key_bytes(dcf, batch) == [batch[i].to_bytes() for i in range(batch.n)]


def test_the_public_path_of_round_two_still_names_the_spool():
    """DESIGN.md's public names keep `dpcdf.service.spool.Spool` after the spool moved to client/."""
    from dpcdf.service import client
    from dpcdf.service.spool import Spool

    assert Spool is client.Spool
