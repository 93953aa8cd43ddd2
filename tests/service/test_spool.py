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



def test_a_row_spooled_with_another_value_column_is_the_same_row(tmp_path):
    spool = Spool.open(tmp_path / "s.spool", FP)
    rows = [b"1\x1f30\x1f5.0", b"2\x1f41\x1f7.0", b"3\x1f30\x1f7.0"]
    income, age = np.array([5.0, 7.0, 7.0]), np.array([30.0, 41.0, 30.0])
    keys = spool.content_digests(rows)
    d = spool.digests(income, contents=rows)
    first = spool.admit(d, "p.csv", [2, 3, 4], contents=keys)
    spool.add(first, [(bytes([i]) * 16, b"r", d[i], i + 2, keys[i]) for i in first.new])
    other = spool.digests(age, contents=rows)
    with pytest.raises(DuplicateRows, match=r"all 3 of the 3 rows of p.csv were spooled .* another value .*lines 2-4 equal lines 2-4"):
        spool.admit(other, "p.csv", [2, 3, 4], contents=keys)  # --column age of the same rows: the same people
    with pytest.raises(DuplicateRows, match="another value"):
        spool.admit(other[1:], "q.csv", [3, 4], contents=keys[1:])  # from a copy of the file too
    labelled = spool.digests(income, labels=np.array([1, 0, 1]), contents=rows)
    with pytest.raises(DuplicateRows, match="another value"):  # another --label-column: the same rows
        spool.admit(labelled, "p.csv", [2, 3, 4], contents=keys)
    assert spool.admit(other, "p.csv", [2, 3, 4], allow_duplicates=True, contents=keys).new.size == 3  # the user's word
    assert spool.admit(d, "p.csv", contents=keys).spooled == 3  # the first column: nothing new
    fresh = [b"4\x1f50\x1f9.0"]
    assert spool.admit(spool.digests([50.0], contents=fresh), "p2.csv", contents=spool.content_digests(fresh)).new.size == 1


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


# --- the upload: both servers at once, while reports are made (a fake pair of servers, no sockets) ---------------

def _offline_task():
    """A task whose two HPKE keys are throwaway ones: reports can be made, nothing listens at its URLs."""
    from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
    from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

    from dpcdf.service.task import TaskConfig, token_hash

    keys = [X25519PrivateKey.generate().public_key().public_bytes(Encoding.Raw, PublicFormat.Raw).hex() for _ in (0, 1)]
    return TaskConfig(dict(GRID), 1.0, "tree", "substitution", 1, ("http://127.0.0.1:1", "http://127.0.0.1:2"),
                      (keys[0], keys[1]), token_hash("t"), verify=False)


class FakeServers:
    """Stands in for `data_holder.http`: stores each server's report ids (a duplicate is acknowledged, as a
    real server does), checks that every report it is sent is already committed to the spool file (read
    through a connection of its own), and runs `hook(party, ids)` before answering."""

    def __init__(self, config, spool_path, hook=None):
        import sqlite3
        import threading

        self.config, self.path, self.hook = config, str(spool_path), hook
        self.stored = {0: [], 1: []}
        self.sent = {0: 0, 1: 0}
        self.lock = threading.Lock()
        self.sqlite3 = sqlite3

    def __call__(self, method, url, body=None, token=None, content_type="", timeout=0):
        from dpcdf.service.wire import Report, decode_batch

        party = self.config.servers.index(url.split("/tasks/")[0])
        ids = [Report.from_bytes(raw).report_id for raw in decode_batch(body)]
        db = self.sqlite3.connect(f"file:{self.path}?mode=ro", uri=True)
        try:
            committed = {bytes(r) for (r,) in db.execute("SELECT report_id FROM reports")}
        finally:
            db.close()
        assert set(ids) <= committed, "a report was sent before its batch was committed to the spool"
        if self.hook:
            self.hook(party, ids)
        with self.lock:
            new = [i for i in ids if i not in self.stored[party]]
            self.stored[party] += new
            self.sent[party] += 1
        return {"accepted": len(new), "duplicates": len(ids) - len(new), "rejected": []}


def test_submit_sends_to_both_servers_at_once_while_it_makes_the_next_batches(tmp_path, monkeypatch):
    import threading

    from dpcdf.service.client import data_holder

    config, path = _offline_task(), tmp_path / "s.spool"
    both = threading.Barrier(2, timeout=20)  # each server's first request waits for the other's: sent at once
    first_at = {}

    def hook(party, ids):
        if party not in first_at:
            first_at[party] = _spooled(path)  # how many reports were made when it came
            both.wait()

    fake = FakeServers(config, path, hook)
    monkeypatch.setattr(data_holder, "http", fake)
    out = submit(config, values(2000, 41), batch=100, spool=path)
    assert (out["complete"], out["pending"]) == (2000, 0)
    assert len(set(fake.stored[0])) == len(set(fake.stored[1])) == 2000 and fake.sent == {0: 20, 1: 20}
    assert max(first_at.values()) < 2000, f"the upload began only after every report was made: {first_at}"


def _spooled(path) -> int:
    import sqlite3

    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return db.execute("SELECT COUNT(*) FROM reports").fetchone()[0]
    finally:
        db.close()


def test_a_refused_batch_stops_both_uploads_and_is_raised(tmp_path, monkeypatch):
    from dpcdf.service.client import data_holder
    from dpcdf.service.http import ServerError

    config, path = _offline_task(), tmp_path / "s.spool"

    def hook(party, ids):
        if party == 1:
            raise ServerError("http://127.0.0.1:2/tasks/x/reports/batch: HTTP 409 collection is closed", 409)

    fake = FakeServers(config, path, hook)
    monkeypatch.setattr(data_holder, "http", fake)
    with pytest.raises(ServerError, match="409 collection is closed"):
        submit(config, values(3000, 42), batch=100, spool=path)
    spool = Spool.open(path, config.fingerprint)  # closed and unlocked; nothing recorded for server 1
    try:
        # server 0's answer to a request under way when both stopped is not recorded (a re-run resends it)
        assert spool.acknowledged(1) == 0 and spool.acknowledged(0) <= len(fake.stored[0]) < 3000
    finally:
        spool.close()


def test_ctrl_c_while_making_or_sending_loses_nothing_and_a_rerun_sends_nothing_twice(tmp_path, monkeypatch):
    import threading

    from dpcdf.service.client import data_holder

    config, path, vals = _offline_task(), tmp_path / "s.spool", values(1500, 43)
    release = threading.Event()

    def slow(party, ids):  # server 1 answers only after the interrupt: its request is abandoned mid-flight
        if party == 1:
            release.wait(20)

    fake = FakeServers(config, path, slow)
    monkeypatch.setattr(data_holder, "http", fake)
    made, real = [0], data_holder.make_reports

    def interrupted(*args, **kwargs):
        made[0] += 1
        if made[0] == 4:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(data_holder, "make_reports", interrupted)
    with pytest.raises(KeyboardInterrupt):
        submit(config, vals, batch=200, spool=path)
    release.set()
    assert _spooled(path) == 600  # the three committed batches, nothing half-made
    monkeypatch.setattr(data_holder, "make_reports", real)
    fake.hook = None
    again = submit(config, vals, batch=200, spool=path)  # the same input again: only the missing rows are made
    assert (again["new"], again["already_spooled"], again["complete"], again["pending"]) == (900, 600, 1500, 0)
    for party in (0, 1):  # each report stored once per server, and only the 1,500 made
        assert len(fake.stored[party]) == len(set(fake.stored[party])) == 1500


def test_a_spool_written_before_row_contents_opens_and_keeps_its_reports(tmp_path):
    import sqlite3

    path = tmp_path / "old.spool"
    spool = Spool.open(path, FP)
    _fill(spool, 0, 5)
    spool.close()
    with sqlite3.connect(path) as db:  # the tables as an earlier dpcdf made them
        db.execute("DROP TABLE contents")
    spool = Spool.open(path, FP)
    assert spool.spooled() == 5
    _fill(spool, 0, 8)  # its rows are still known; new ones are made
    assert spool.spooled() == 8
    spool.close()
    with sqlite3.connect(path) as db:  # and an earlier dpcdf's insert still fits the reports table
        db.execute("INSERT INTO reports VALUES (?, ?, ?, ?, ?, ?)", (8, b"i" * 16, b"r", b"d" * 16, 1, 9))


def test_a_rerun_or_an_extension_of_a_file_with_equal_rows_is_not_another_column(tmp_path):
    """One-column CSVs repeat rows (two people with equal values): interrupted after some were spooled,
    or extended, the same file must be admitted (the review of the column rule refused both)."""
    spool = Spool.open(tmp_path / "s.spool", FP)
    rows = [b"10", b"20", b"10", b"30"]
    vals = np.array([10.0, 20.0, 10.0, 30.0])
    keys, d = spool.content_digests(rows), spool.digests(vals, contents=rows)
    first = spool.admit(d, "in.csv", [2, 3, 4, 5], contents=keys)
    spool.add(first, [(bytes([i]) * 16, b"r", d[i], i + 2, keys[i]) for i in first.new[:2]])  # interrupted after two
    again = spool.admit(d, "in.csv", [2, 3, 4, 5], contents=keys)
    assert again.new.tolist() == [2, 3] and again.spooled == 2 and not again.duplicates
    spool.add(again, [(bytes([10 + i]) * 16, b"r", d[i], i + 2, keys[i]) for i in again.new])
    longer = rows + [b"10", b"40"]
    grown = spool.admit(spool.digests(np.append(vals, [10.0, 40.0]), contents=longer), "in.csv", range(2, 8),
                        contents=spool.content_digests(longer))
    assert grown.new.tolist() == [4, 5] and grown.spooled == 4 and not grown.duplicates


def test_ctrl_c_just_after_a_commit_is_an_interruption_and_the_rows_stay(tmp_path):
    """A KeyboardInterrupt raised as the COMMIT returns (the new-user review hit it in 6 of 30 Ctrl-Cs)
    reached ROLLBACK with no transaction open: "unexpected error (OperationalError ...)"."""
    class InterruptAfterCommit:
        def __init__(self, db):
            self.db, self.armed = db, False

        def execute(self, sql, *args):
            out = self.db.execute(sql, *args)
            if self.armed and sql == "COMMIT":
                self.armed = False
                raise KeyboardInterrupt
            return out

        def __getattr__(self, name):
            return getattr(self.db, name)

    spool = Spool.open(tmp_path / "s.spool", FP)
    spool.db = InterruptAfterCommit(spool.db)
    _fill(spool, 0, 3)
    spool.db.armed = True
    with pytest.raises(KeyboardInterrupt):
        _fill(spool, 3, 6)
    assert spool.spooled() == 6  # committed before the interrupt
    spool.close()
