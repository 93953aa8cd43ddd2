"""Retention in the store (issue 24, `dpcdf.service.storage.retention`): which tasks are released, what a
purge deletes and keeps, that the shares' bytes leave the SQLite files, that a purge interrupted
between its transaction and its files is finished by `recover`, and the schema's migration 8."""
import os
import secrets
import sqlite3
import time

import pytest

from dpcdf.errors import DpcdfError
from dpcdf.service.storage import Mark, Store, UnknownTask
from dpcdf.service.storage import retention as policy
from dpcdf.service.storage.records import SegmentFile
from dpcdf.service.storage.schema import LATEST
from dpcdf.service.storage.segments import task_dir


def _hash(ids):
    return "h%d" % len(ids)


def _task(store, task_id, n=20, verify=True):
    config = '{"verify": true}' if verify else "{}"
    store.add_task(task_id, config, b"f" * 32, secrets.token_bytes(32))
    marker = f"SHARE-OF-{task_id}-".encode()
    store.add_many(task_id, [(secrets.token_bytes(16), marker + secrets.token_bytes(48)) for _ in range(n)])
    return marker


def _final(store, data, task_id, answered=False):
    """A verified task whose close is over: reconciled, verified, its histogram share, DONE journalled."""
    frozen = store.freeze(task_id, _hash)
    store.mark(task_id, Mark.RECONCILED)
    store.mark(task_id, Mark.VERIFIED)
    store.save_histogram(task_id, frozen.digest, (4, 1), bytes(range(32)))
    store.record_exchange(task_id, "helper", 5, 0, b"round one" * 10, b"answer")  # a check step
    directory = task_dir(data, task_id)
    directory.mkdir(parents=True)
    (directory / "00000.seeds.npy").write_bytes(b"key shares")
    store.record_segments(task_id, [SegmentFile(0, "seeds", frozen.count, "00000.seeds.npy", "0" * 64, frozen.digest)])
    if answered:
        store.mark(task_id, Mark.ANSWERED)
    else:
        store.record_exchange(task_id, "helper", policy.DONE_KIND, 0, b"", b"")


def test_a_verified_task_is_released_once_its_close_is_over_and_keeps_what_queries_need(tmp_path):
    store = Store(tmp_path / "server.sqlite")
    _task(store, "open")
    _task(store, "unverified", verify=False)
    store.freeze("unverified", _hash)
    store.mark("unverified", Mark.RECONCILED)
    _task(store, "checking")
    store.freeze("checking", _hash)
    store.mark("checking", Mark.RECONCILED)
    store.mark("checking", Mark.VERIFIED)  # verified, but its exchange with the other server is not over
    marker = _task(store, "done")
    _final(store, tmp_path, "done")
    _task(store, "answered")
    _final(store, tmp_path, "answered", answered=True)
    assert policy.released(store) == ["done", "answered"]
    seed, histogram, frozen = store.task("done")[1], store.histogram("done"), store.frozen("done")
    out = policy.purge(store, "done", "released", tmp_path)
    assert out == policy.Purged("done", "released", 20, 1)
    assert store.count("done") == 0 and store.segments("done") == [] and not task_dir(tmp_path, "done").exists()
    assert store.check_batches("done") == []
    assert store.task("done")[1] == seed and store.histogram("done") == histogram and store.frozen("done") == frozen
    assert store.exchange("done", "helper", policy.DONE_KIND, 0) is not None  # the exchange stays finished
    assert store.exchange("done", "helper", 5, 0) is None  # the check's journal, derived from the shares, goes
    assert policy.gone(store, "done") is None  # released tasks still answer
    assert policy.purge(store, "done", "released", tmp_path).reports == 0  # idempotent
    assert policy.released(store) == ["answered"]
    store.close()
    for name in ("server.sqlite", "server.sqlite-wal"):
        path = tmp_path / name
        assert not path.exists() or marker not in path.read_bytes(), name  # secure_delete + checkpoint
    assert b"SHARE-OF-open-" in (tmp_path / "server.sqlite").read_bytes()  # the test would see them


def test_expired_and_deleted_tasks_keep_only_their_row_and_refuse_uploads(tmp_path):
    store = Store(tmp_path / "server.sqlite")
    _task(store, "old")
    _task(store, "done")
    _final(store, tmp_path, "done")
    store.db.execute("UPDATE tasks SET created = created - 100 WHERE task_id IN ('old', 'done')")
    _task(store, "new")
    assert policy.expired(store, time.time() - 50) == ["old", "done"]
    seed = store.task("old")[1]
    assert policy.purge(store, "old", "expired", tmp_path).reports == 20
    assert policy.gone(store, "old") == "expired"
    assert store.task("old")[1] != seed and len(store.task("old")[1]) == 32  # the seed is overwritten
    assert store.frozen("old") == (0, 0, "")  # its collection is closed on no report set
    with pytest.raises(DpcdfError):
        store.add_many("old", [(b"i" * 16, b"share")])
    policy.purge(store, "done", "deleted", tmp_path)
    assert store.histogram("done") is None and store.rejections("done") == {} and policy.gone(store, "done") == "deleted"
    assert policy.purge(store, "done", "released", tmp_path).reports == 0  # a gone task stays gone
    assert policy.gone(store, "done") == "deleted"
    with pytest.raises(UnknownTask):
        policy.purge(store, "nope", "deleted", tmp_path)
    listing = {t["task_id"]: t for t in policy.tasks(store)}
    assert listing["old"]["state"] == "expired" and listing["old"]["stored"] == 0
    assert listing["new"]["state"] == "collecting" and listing["new"]["stored"] == 20 and listing["new"]["verified_task"]
    assert listing["done"]["state"] == "deleted" and not listing["done"]["histogram"]


def test_a_purge_interrupted_after_its_transaction_is_finished_by_recover(tmp_path):
    store = Store(tmp_path / "server.sqlite")
    _task(store, "t")
    _final(store, tmp_path, "t")

    class Crash(Exception):
        pass

    def crash():
        raise Crash

    with pytest.raises(Crash):
        policy.purge(store, "t", "released", tmp_path, after_commit=crash)
    assert store.count("t") == 20 and task_dir(tmp_path, "t").exists()  # marked; its rows and files left
    assert store.segments("t") == [] and store.exchange("t", "helper", 5, 0) is None  # the small rows went with the mark
    store.close()
    store = Store(tmp_path / "server.sqlite")  # a restart
    assert policy.released(store) == []  # marked: not marked twice
    assert policy.recover(store, tmp_path) == 20 + 1 and not task_dir(tmp_path, "t").exists() and store.count("t") == 0
    assert policy.recover(store, tmp_path) == 0


def test_report_rows_go_in_chunks(tmp_path, monkeypatch):
    monkeypatch.setattr(policy, "CHUNK", 7)
    store = Store(tmp_path / "server.sqlite")
    _task(store, "t", n=30)
    _task(store, "other", n=5)
    store.freeze("t", _hash)
    assert policy.purge(store, "t", "deleted", tmp_path).reports == 30
    assert store.count("t") == 0 and store.count("other") == 5


def test_migration_8_adds_the_retention_columns_to_a_version_7_store(tmp_path):
    Store(tmp_path / "s.sqlite").close()
    db = sqlite3.connect(tmp_path / "s.sqlite")
    db.execute("ALTER TABLE tasks DROP COLUMN purge_reason")
    db.execute("ALTER TABLE tasks DROP COLUMN purged_at")
    db.execute("PRAGMA user_version = 7")
    db.commit()
    db.close()
    store = Store(tmp_path / "s.sqlite")
    columns = {r[1] for r in store.db.execute("PRAGMA table_info(tasks)")}
    assert {"purged_at", "purge_reason"} <= columns
    assert store.db.execute("PRAGMA user_version").fetchone()[0] == LATEST == 10


@pytest.mark.parametrize("text,seconds", [("30d", 30 * 86400), ("12h", 43200), ("90m", 5400), ("45s", 45), ("2", 2),
                                          ("1.5h", 5400), ("2w", 14 * 86400)])
def test_durations(text, seconds):
    assert policy.parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "0d", "-1d", "3y", "d", "1 day"])
def test_bad_durations_are_one_line_errors(text):
    with pytest.raises(DpcdfError, match="a retention must be a positive duration"):
        policy.parse_duration(text)


def test_files_of_a_task_are_removed_with_the_directory(tmp_path):
    directory = task_dir(tmp_path, "x")
    directory.mkdir(parents=True)
    for i in range(3):
        (directory / f"{i}.npy").write_bytes(os.urandom(8))
    assert policy.remove_files(tmp_path, "x") == 3 and not directory.exists()
    assert policy.remove_files(tmp_path, "x") == 0


def test_a_purge_that_frees_most_of_the_store_shrinks_its_file(tmp_path):
    """Issue 46: purged key shares are zeroed (secure_delete) and, once a quarter of the pages are free,
    the store is VACUUMed: the file shrinks to what the live tasks hold, and they keep every row."""
    path = tmp_path / "server.sqlite"
    store = Store(path)
    _task(store, "big", n=6000)
    keep = _task(store, "small", n=50)
    store.db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    before = os.path.getsize(path)
    policy.purge(store, "big", "deleted", tmp_path)
    after = os.path.getsize(path)
    assert after < before / 4, (before, after)
    assert store.db.execute("SELECT COUNT(*) FROM reports WHERE task_id = 'small'").fetchone()[0] == 50
    assert store.db.execute("PRAGMA freelist_count").fetchone()[0] == 0
    assert keep in b"".join(r[0] for r in store.db.execute("SELECT key_share FROM reports WHERE task_id = 'small'"))
    _task(store, "other", n=30)  # a purge that frees little does not rewrite the store
    assert not policy.vacuum_if_sparse(store)
