"""The server's durable store, used directly on a temporary SQLite file (no HTTP)."""
from __future__ import annotations

import hashlib
import os
import sqlite3
import stat
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dpcdf.errors import DpcdfError
from dpcdf.service.storage.records import AlreadyAnswered, CollectionClosed, CollectionOpen, Frozen, Mark, StoreError, UnknownTask
from dpcdf.service.storage.store import Store

TASK = "t1"


def set_hash(ids: list[bytes]) -> str:
    """Order-independent, like the keyed hash the server uses."""
    h = hashlib.sha256()
    for i in sorted(ids):
        h.update(len(i).to_bytes(2, "big") + i)
    return h.hexdigest()


def rid(i: int) -> bytes:
    return i.to_bytes(16, "big")


def share(i: int) -> bytes:
    return b"share-" + str(i).encode()


def new_store(path: Path, *tasks: str) -> Store:
    store = Store(path)
    for t in tasks or (TASK,):
        assert store.add_task(t, f'{{"task_id": "{t}"}}', b"fp", b"seed-" + t.encode()) is None
    return store


@pytest.fixture
def store(tmp_path):
    s = new_store(tmp_path / "server.sqlite")
    yield s
    s.close()


def test_add_task_conflict_and_lookup(store):
    assert store.add_task(TASK, '{"task_id": "t1"}', b"fp", b"other seed") is None  # identical config: fine
    assert store.add_task(TASK, '{"changed": 1}', b"fp", b"seed") == '{"task_id": "t1"}'
    assert store.task(TASK) == ('{"task_id": "t1"}', b"seed-t1")  # the first seed is kept
    assert store.task("nope") is None


def test_replay_is_stored_once_and_counted_once(store):
    assert store.add_reports(TASK, [(rid(1), share(1)), (rid(2), share(2))]) == [True, True]
    assert store.add_reports(TASK, [(rid(2), b"replayed"), (rid(3), share(3)), (rid(3), share(3))]) == [False, True, False]
    assert store.add_many(TASK, [(rid(1), share(1)), (rid(4), share(4)), (rid(4), share(4))]) == 1
    assert store.count(TASK) == 4
    shares, last = store.shares_since(TASK, 0, 10**9)
    assert shares == [share(1), share(2), share(3), share(4)]  # the replay did not overwrite the share
    assert last > 0
    assert store.shares_since(TASK, last, 10**9) == ([], last)


@settings(max_examples=40)
@given(st.lists(st.lists(st.integers(0, 30), max_size=20), max_size=6), st.lists(st.booleans(), min_size=6, max_size=6))
def test_random_batches_count_distinct_ids(batches, use_many):
    with tempfile.TemporaryDirectory() as tmp:
        store = new_store(Path(tmp) / "s.sqlite")
        seen: set[int] = set()
        for batch, many in zip(batches, use_many):
            items = [(rid(i), share(i)) for i in batch]
            expect_new = len(set(batch) - seen)
            if many:
                assert store.add_many(TASK, items) == expect_new
            else:
                added = store.add_reports(TASK, items)
                fresh, expected = set(seen), []
                for i in batch:
                    expected.append(i not in fresh)
                    fresh.add(i)
                assert added == expected
            seen |= set(batch)
        assert store.count(TASK) == len(seen)
        fixed = store.freeze(TASK, set_hash)
        assert (fixed.count, fixed.digest) == (len(seen), set_hash([rid(i) for i in seen]))
        assert sorted(store.frozen_ids(TASK)) == sorted(rid(i) for i in seen)
        store.close()


def test_tasks_are_separate(tmp_path):
    store = new_store(tmp_path / "s.sqlite", "a", "b")
    store.add_many("a", [(rid(1), share(1))])
    store.add_many("b", [(rid(1), share(1)), (rid(2), share(2))])  # the same id in another task is new
    store.freeze("a", set_hash)
    assert store.frozen("b") is None
    assert store.add_reports("b", [(rid(3), share(3))]) == [True]
    assert (store.count("a"), store.count("b")) == (1, 3)


def test_freeze_fixes_the_set_and_closes_collection(store):
    store.add_many(TASK, [(rid(i), share(i)) for i in range(5)])
    assert store.frozen(TASK) is None
    assert not store.marked(TASK, "frozen")
    fixed = store.freeze(TASK, set_hash)
    assert isinstance(fixed, Frozen)
    seq, n, digest = fixed  # callers unpack it as a tuple
    assert (n, digest) == (5, set_hash([rid(i) for i in range(5)]))
    assert store.frozen(TASK) == (seq, n, digest)
    assert store.marked(TASK, Mark.FROZEN)
    for add in (store.add_reports, store.add_many):
        with pytest.raises(CollectionClosed) as exc:
            add(TASK, [(rid(99), share(99))])
        assert isinstance(exc.value, DpcdfError)
    assert store.count(TASK) == 5
    assert store.shares_since(TASK, 0, seq)[0] == [share(i) for i in range(5)]


def test_freeze_is_idempotent(store):
    store.add_many(TASK, [(rid(i), share(i)) for i in range(3)])
    first = store.freeze(TASK, set_hash)

    def never(ids):
        raise AssertionError("a second freeze must not rehash")
    assert store.freeze(TASK, never) == first
    store.exclude(TASK, [rid(0)], set_hash)
    assert store.freeze(TASK, never) == store.frozen(TASK)  # the current set, not a fresh one
    assert store.frozen(TASK).count == 2


def test_freeze_of_an_empty_task(store):
    assert store.freeze(TASK, set_hash) == (0, 0, set_hash([]))
    assert store.frozen_ids(TASK) == []


def test_exclude_drops_and_recomputes(store):
    store.add_many(TASK, [(rid(i), share(i)) for i in range(6)])
    seq, _, before = store.freeze(TASK, set_hash)
    fixed = store.exclude(TASK, [rid(1), rid(4), rid(77)], set_hash)  # an unknown id changes nothing
    kept = [rid(i) for i in (0, 2, 3, 5)]
    assert fixed == (seq, 4, set_hash(kept))
    assert fixed.digest != before
    assert store.frozen(TASK) == fixed
    assert store.frozen_ids(TASK) == kept
    assert store.shares_since(TASK, 0, seq)[0] == [share(i) for i in (0, 2, 3, 5)]
    assert store.count(TASK) == 6  # excluded reports stay stored
    assert store.exclude(TASK, [rid(1)], set_hash) == fixed  # again: nothing more to drop


def test_exclude_after_answer_is_refused(store):
    store.add_many(TASK, [(rid(i), share(i)) for i in range(4)])
    fixed = store.freeze(TASK, set_hash)
    store.mark(TASK, "reconciled")
    store.mark(TASK, Mark.ANSWERED)
    with pytest.raises(AlreadyAnswered) as exc:
        store.exclude(TASK, [rid(0)], set_hash)
    assert isinstance(exc.value, DpcdfError)
    assert store.frozen(TASK) == fixed
    assert len(store.frozen_ids(TASK)) == 4


def test_failing_set_hash_in_exclude_rolls_back(store):
    store.add_many(TASK, [(rid(i), share(i)) for i in range(4)])
    fixed = store.freeze(TASK, set_hash)

    def broken(ids):
        raise RuntimeError("hash failed")
    with pytest.raises(RuntimeError, match="hash failed"):
        store.exclude(TASK, [rid(0), rid(1)], broken)
    assert not store.db.in_transaction
    assert store.frozen(TASK) == fixed
    assert store.frozen_ids(TASK) == [rid(i) for i in range(4)]
    assert store.db.execute("SELECT COUNT(*) FROM excluded").fetchone()[0] == 0
    # and the store still works afterwards
    assert store.exclude(TASK, [rid(0)], set_hash).count == 3


def test_failing_set_hash_in_freeze_leaves_collection_open(store):
    store.add_many(TASK, [(rid(1), share(1))])

    def broken(ids):
        raise KeyboardInterrupt  # a BaseException rolls back too
    with pytest.raises(KeyboardInterrupt):
        store.freeze(TASK, broken)
    assert store.frozen(TASK) is None
    assert store.add_reports(TASK, [(rid(2), share(2))]) == [True]


def test_a_failing_batch_stores_nothing(store):
    with pytest.raises(TypeError):
        store.add_reports(TASK, [(rid(1), share(1)), (rid(2), None)])
    with pytest.raises(TypeError):
        store.add_many(TASK, [(rid(3), share(3)), (rid(4), None)])
    assert store.count(TASK) == 0
    assert not store.db.in_transaction


def test_marks(store):
    store.add_many(TASK, [(rid(1), share(1))])
    assert not store.marked(TASK, "reconciled") and not store.marked(TASK, "answered")
    with pytest.raises(CollectionOpen):  # milestones of a closed set only
        store.mark(TASK, "reconciled")
    store.freeze(TASK, set_hash)
    store.mark(TASK, "reconciled")
    assert store.marked(TASK, "reconciled") and store.marked(TASK, Mark.RECONCILED)
    assert not store.marked(TASK, "answered")
    store.mark(TASK, "reconciled")  # again: no error, still marked
    assert store.marked(TASK, "reconciled")
    assert not store.marked("other task", "reconciled")
    with pytest.raises(UnknownTask):
        store.mark("other task", "answered")


@pytest.mark.parametrize("bad", ["typo", "Answered", "", "closed"])
def test_unknown_mark_raises(store, bad):
    store.freeze(TASK, set_hash)
    with pytest.raises(ValueError, match="unknown mark"):
        store.marked(TASK, bad)
    with pytest.raises(ValueError, match="unknown mark"):
        store.mark(TASK, bad)


def test_frozen_is_set_by_freeze_only(store):
    with pytest.raises(ValueError, match="freeze"):
        store.mark(TASK, "frozen")
    assert store.frozen(TASK) is None


def test_open_collection_has_no_frozen_set(store):
    with pytest.raises(CollectionOpen):
        store.frozen_ids(TASK)
    with pytest.raises(CollectionOpen):
        store.exclude(TASK, [rid(1)], set_hash)


def test_unknown_task(store):
    assert store.frozen("nope") is None
    for call in (lambda: store.add_reports("nope", [(rid(1), share(1))]), lambda: store.add_many("nope", []),
                 lambda: store.freeze("nope", set_hash)):
        with pytest.raises(UnknownTask) as exc:
            call()
        assert isinstance(exc.value, StoreError) and isinstance(exc.value, DpcdfError)
    assert store.count("nope") == 0


def test_fix_release_keeps_the_first_params(store):
    assert store.fix_release(TASK, "groups", "[1, 2]") == "[1, 2]"
    assert store.fix_release(TASK, "groups", "[3]") == "[1, 2]"
    assert store.fix_release(TASK, "other", "x") == "x"
    # release kinds and milestones no longer share a namespace
    assert store.fix_release(TASK, "answered", "y") == "y"
    assert not store.marked(TASK, "answered")


def test_state_survives_reopening(tmp_path):
    path = tmp_path / "server.sqlite"
    store = new_store(path, "a", "b")
    store.add_many("a", [(rid(i), share(i)) for i in range(5)])
    store.add_reports("b", [(rid(1), share(1))])
    store.freeze("a", set_hash)
    fixed = store.exclude("a", [rid(2)], set_hash)
    store.mark("a", "reconciled")
    store.mark("a", "answered")
    store.fix_release("a", "groups", "[4]")
    store.log_query("a", "prefix", 3)
    store.close()

    again = Store(path)  # a restart
    assert again.task("a") == ('{"task_id": "a"}', b"seed-a")
    assert again.frozen("a") == fixed
    assert again.frozen_ids("a") == [rid(i) for i in (0, 1, 3, 4)]
    assert again.marked("a", "reconciled") and again.marked("a", "answered")
    with pytest.raises(AlreadyAnswered):
        again.exclude("a", [rid(0)], set_hash)
    with pytest.raises(CollectionClosed):
        again.add_many("a", [(rid(9), share(9))])
    assert again.fix_release("a", "groups", "[5]") == "[4]"
    assert again.frozen("b") is None and not again.marked("b", "reconciled")
    assert again.add_reports("b", [(rid(1), share(1)), (rid(2), share(2))]) == [False, True]
    assert again.db.execute("SELECT task_id, kind, points FROM queries").fetchall() == [("a", "prefix", 3)]
    again.close()


def test_acknowledged_reports_are_committed(store, tmp_path):
    store.add_reports(TASK, [(rid(1), share(1))])
    store.add_many(TASK, [(rid(2), share(2))])
    other = sqlite3.connect(str(tmp_path / "server.sqlite"))  # another connection sees them at once
    assert other.execute("SELECT COUNT(*) FROM reports").fetchone()[0] == 2
    other.close()


def test_file_mode_is_0600(tmp_path):
    old = os.umask(0o022)
    try:
        path = tmp_path / "server.sqlite"
        store = new_store(path)
        store.add_many(TASK, [(rid(1), share(1))])
        for p in (path, Path(str(path) + "-wal")):
            assert stat.S_IMODE(p.stat().st_mode) == 0o600, p
        store.close()
    finally:
        os.umask(old)


def test_columns_are_typed(store):
    """STRICT tables: a value of the wrong type is refused rather than stored as given."""
    with pytest.raises(sqlite3.IntegrityError):
        store.db.execute("UPDATE tasks SET frozen_seq = 'seven', report_count = 1, set_hash = 'h', closed_at = 0")
    with pytest.raises(sqlite3.IntegrityError):  # answered implies closed
        store.db.execute("UPDATE tasks SET answered_at = 1.0")
    with pytest.raises(sqlite3.IntegrityError):  # a closed set is all four columns or none
        store.db.execute("UPDATE tasks SET frozen_seq = 1")


def test_refuses_a_file_of_another_schema(tmp_path):
    path = tmp_path / "old.sqlite"
    db = sqlite3.connect(str(path))
    db.execute("CREATE TABLE tasks (task_id TEXT PRIMARY KEY)")
    db.commit()
    db.close()
    with pytest.raises(StoreError, match="older version"):
        Store(path)
    db = sqlite3.connect(str(path))
    db.execute("PRAGMA user_version = 99")
    db.commit()
    db.close()
    with pytest.raises(StoreError, match="version 99"):
        Store(path)


def test_a_store_from_before_verification_gains_its_columns_and_keeps_its_rows(tmp_path):
    """A store written before verified tasks (no verified_at, no excluded.reason, no histograms)
    opens: the columns are added, an old exclusion reads as the reconciliation's (reason NULL)."""
    import sqlite3

    from dpcdf.service.storage.schema import SCHEMA, SCHEMA_VERSION
    from dpcdf.service.storage.store import Store

    path = tmp_path / "old.sqlite"
    db = sqlite3.connect(str(path))
    db.executescript(SCHEMA + f";PRAGMA user_version = {SCHEMA_VERSION};")
    db.execute("INSERT INTO tasks (task_id, config, fingerprint, noise_seed, created) VALUES ('t', '{}', x'00', x'00', 0)")
    for i in range(3):
        db.execute("INSERT INTO reports (task_id, report_id, key_share, received) VALUES ('t', ?, x'01', 0)", (bytes([i]) * 16,))
    db.execute("INSERT INTO excluded VALUES ('t', ?)", (bytes([0]) * 16,))
    db.commit()
    db.close()
    store = Store(path)
    try:
        store.freeze("t", lambda ids: str(len(ids)))
        assert store.reconciled_ids("t") == [bytes([1]) * 16, bytes([2]) * 16]
        assert store.rejections("t") == {}
        store.exclude("t", [bytes([2]) * 16], lambda ids: str(len(ids)), reason="shape")
        assert store.rejections("t") == {"shape": 1} and store.frozen("t").count == 1
        assert store.reconciled_ids("t") == [bytes([1]) * 16, bytes([2]) * 16]  # the check's input keeps it
        assert not store.marked("t", "verified")
        store.mark("t", "verified")
        assert store.marked("t", "verified") and store.histogram("t") is None
    finally:
        store.close()


def test_reconciled_ids_follow_every_exclusion_although_kept_in_memory(store):
    store.add_many(TASK, [(rid(i), share(i)) for i in (3, 0, 4, 1, 2)])
    store.freeze(TASK, set_hash)  # keeps its sorted ids as reconciled_ids: the same as SQLite's order
    fresh = Store(store.path)
    try:
        assert fresh.reconciled_ids(TASK) == store.reconciled_ids(TASK) == [rid(i) for i in range(5)]
    finally:
        fresh.close()
    first = store.reconciled_ids(TASK)
    first.clear()  # a caller's list is its own
    assert store.reconciled_ids(TASK) == [rid(i) for i in range(5)]
    store.exclude(TASK, [rid(3)], set_hash)  # the reconciliation's drop: gone from the checked set
    assert store.reconciled_ids(TASK) == [rid(i) for i in (0, 1, 2, 4)]
    store.exclude(TASK, [rid(1)], set_hash, reason="shape")  # the check's: still in it
    assert store.reconciled_ids(TASK) == [rid(i) for i in (0, 1, 2, 4)]
    assert store.frozen_ids(TASK) == [rid(i) for i in (0, 4, 2)]  # upload order


def test_numbered_migrations_bring_any_older_store_to_the_latest_version_once(tmp_path):
    """Version 1 files, with none or some of the later tables (added at every open before the
    numbering), reach LATEST with every table, column and view; reopening changes nothing; the
    `counted` view is the rule for which reports count (stored, not excluded for any reason)."""
    import sqlite3

    from dpcdf.service.storage.schema import CHECK_SCHEMA, LATEST, SCHEMA, SCHEMA_VERSION

    for extra in ("", CHECK_SCHEMA):
        path = tmp_path / f"v1{len(extra)}.sqlite"
        db = sqlite3.connect(str(path))
        db.executescript(SCHEMA + ";" + extra + f";PRAGMA user_version = {SCHEMA_VERSION};")
        db.commit()
        db.close()
        for _ in range(2):
            Store(path).close()
            db = sqlite3.connect(str(path))
            names = {r[0] for r in db.execute("SELECT name FROM sqlite_master")}
            assert db.execute("PRAGMA user_version").fetchone()[0] == LATEST > SCHEMA_VERSION
            assert {"segments", "histograms", "check_batches", "exchanges", "counted", "reports_by_task"} <= names
            assert "reason" in {r[1] for r in db.execute("PRAGMA table_info(excluded)")}
            db.close()
    db = sqlite3.connect(str(path))
    db.execute(f"PRAGMA user_version = {LATEST + 1}")
    db.commit()
    db.close()
    with pytest.raises(StoreError, match="newer dpcdf"):
        Store(path)


def test_the_counted_view_leaves_out_both_kinds_of_exclusion(store):
    store.add_many(TASK, [(rid(i), share(i)) for i in range(6)])
    store.freeze(TASK, set_hash)
    store.exclude(TASK, [rid(1)], set_hash)  # the reconciliation's drop
    store.exclude(TASK, [rid(4)], set_hash, reason="shape")  # the check's
    counted = [bytes(r[0]) for r in store.db.execute("SELECT report_id FROM counted WHERE task_id = ? ORDER BY seq", (TASK,))]
    assert counted == [rid(i) for i in (0, 2, 3, 5)] == store.frozen_ids(TASK)
    assert [s for chunk in store.share_chunks(TASK, 10**9, 2) for s in chunk] == [share(i) for i in (0, 2, 3, 5)]


@pytest.mark.parametrize("span", [1, 2, 3, 7, 100])
def test_share_blocks_read_the_counted_rows_in_order_whatever_the_span(tmp_path, span):
    """The segments' read (`share_blocks`: shares end to end, per span of sequence numbers) gives the
    rows of the `counted` view, in upload order: another task's rows between, both kinds of exclusion,
    a bound below the last row."""
    store = new_store(tmp_path / "server.sqlite", TASK, "other")
    for i in range(12):
        store.add_many(TASK if i % 3 else "other", [(rid(i), share(i))])
    store.add_many(TASK, [(rid(i), share(i)) for i in range(20, 30)])
    store.freeze(TASK, set_hash)
    store.exclude(TASK, [rid(4), rid(22)], set_hash)
    store.exclude(TASK, [rid(25)], set_hash, reason="shape")
    upto = store.frozen(TASK).seq
    want = [bytes(r[0]) for r in store.db.execute("SELECT key_share FROM counted WHERE task_id = ? AND seq <= ? ORDER BY seq",
                                                  (TASK, upto))]
    assert want == [share(i) for i in (1, 2, 5, 7, 8, 10, 11, 20, 21, 23, 24, 26, 27, 28, 29)]
    blocks = list(store.share_blocks(TASK, upto, span))
    assert all(0 < n <= span for n, _ in blocks)
    assert b"".join(b for _, b in blocks) == b"".join(want) and sum(n for n, _ in blocks) == len(want)
    assert b"".join(b for _, b in store.share_blocks(TASK, store.frozen(TASK).seq - 3, span)) == b"".join(want[:-3])
    assert list(store.share_blocks("other", 10**12, span))[-1][1].endswith(share(9))  # a bound past the table's end


def test_share_blocks_keep_every_byte_and_refuse_shares_of_different_lengths(tmp_path):
    """SQLite joins a block's shares (group_concat): zero bytes and bytes that are no valid UTF-8 come
    back as they were stored, with and without exclusions; told the shares' size, a block with a share
    of another length is refused, not cut into keys at the wrong places."""
    store = new_store(tmp_path / "server.sqlite", TASK, "other")
    odd = [bytes([0, 255, 0, 0xC3, i]) * 8 for i in range(6)]
    store.add_many(TASK, [(rid(i), odd[i]) for i in range(6)])
    store.freeze(TASK, set_hash)
    assert list(store.share_blocks(TASK, store.frozen(TASK).seq, 4, 40)) == [(4, b"".join(odd[:4])), (2, b"".join(odd[4:]))]
    store.exclude(TASK, [rid(1)], set_hash)
    assert b"".join(b for _, b in store.share_blocks(TASK, store.frozen(TASK).seq, 4)) == b"".join(odd[:1] + odd[2:])
    store.add_many("other", [(rid(10), b"\x00" * 40), (rid(11), b"\x00" * 41)])
    store.freeze("other", set_hash)
    with pytest.raises(StoreError, match="is not 40 bytes"):
        list(store.share_blocks("other", store.frozen("other").seq, 4, 40))


def test_a_small_tasks_unchecked_reports_are_counted_without_reading_other_tasks(tmp_path):
    """Review of issue 44: the worker's count of a task's reports after its last batch (each upload's
    wake) reads that task's rows through `reports_by_task` (migration 10), not every later report of
    every task by seq (45 ms a wake with 3 x 10^5 reports of another task stored after it)."""
    from dpcdf.service.storage.store import _UNCHECKED

    store = Store(tmp_path / "s.sqlite")
    plan = " ".join(str(r[-1]) for r in store.db.execute("EXPLAIN QUERY PLAN SELECT 1 " + _UNCHECKED, ("t", 0, 10, 5)))
    assert "reports_by_task" in plan and "SCAN reports" not in plan, plan
    store.close()
