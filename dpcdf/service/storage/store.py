"""A server's durable state in SQLite (WAL, synchronous=FULL): tasks with their secret noise seeds
and their state (open, closed on a fixed report set, reconciled, answered) in typed columns, key
shares (acknowledged only after the transaction commits), report ids for replay protection, the
parameters of one-off releases, and the query log.

Every write runs in one `BEGIN IMMEDIATE` transaction (`Store._transaction`) under the store's
re-entrant lock: the checks a write depends on (is the collection closed? has the task answered?)
are read inside the same transaction, so they cannot go stale between the check and the write,
and a failure anywhere rolls the whole write back."""
from __future__ import annotations

import secrets
import sqlite3
import threading
import time
from contextlib import contextmanager
from hmac import compare_digest
from itertools import chain
from pathlib import Path
from typing import Callable, Iterator, Sequence

from ..files import create_private
from .lifecycle import DONE_KIND, GONE, MARK_COLUMN, Lifecycle, select
from .records import (AlreadyAnswered, CheckBatch, CollectionClosed, CollectionOpen, Exchange, Frozen, Mark, SegmentFile,
                      StoreError, UnknownTask)
from .schema import migrate

SetHash = Callable[[list[bytes]], str]


# a task's unchecked reports after a seq, up to a seq: plain bounds, so SQLite reads the rowid range, not the table
_UNCHECKED = "FROM reports INDEXED BY reports_by_task WHERE task_id = ? AND seq > ? AND seq <= ? ORDER BY seq LIMIT ?"


class Store:
    def __init__(self, path: Path | str):
        path = Path(path)
        create_private(path)  # before SQLite opens it: it holds noise seeds and key shares
        self.path = path
        self.db = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None)
        self.lock = threading.RLock()  # handlers run in a thread pool; one connection, one writer at a time
        self._reconciled: dict[str, list[bytes]] = {}  # reconciled_ids per task, until its next exclusion
        self._first: dict[str, int] = {}  # a frozen task's first seq (`_before_first`: a scan of its index entries)
        try:
            self.db.execute("PRAGMA journal_mode=WAL")
            self.db.execute("PRAGMA synchronous=FULL")
            self.db.execute("PRAGMA foreign_keys=ON")
            with self._transaction():
                migrate(self.db, path)
            # a running server never writes the restore marks (only `backup` into its copy, and a first start
            # on an unmarked backup, both before a Store opens): a live store's empty table costs no lookup
            self.restored = self.db.execute("SELECT 1 FROM restored LIMIT 1").fetchone() is not None
        except BaseException:
            self.db.close()
            raise

    def close(self) -> None:
        with self.lock:
            self.db.close()

    @contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        """One write: BEGIN IMMEDIATE (the database's write lock, taken before the first read, so the
        checks inside see what the write will change), COMMIT on success, ROLLBACK on any exception.
        Holds the store's lock throughout. Nested use joins the outer transaction."""
        with self.lock:
            if self.db.in_transaction:
                yield self.db
                return
            self.db.execute("BEGIN IMMEDIATE")
            try:
                yield self.db
            except BaseException:
                self.db.execute("ROLLBACK")
                raise
            self.db.execute("COMMIT")

    def _state(self, task_id: str) -> tuple:
        """(frozen_seq, report_count, set_hash, reconciled_at, answered_at) of a stored task; raises
        UnknownTask."""
        row = self.db.execute("SELECT frozen_seq, report_count, set_hash, reconciled_at, answered_at "
                              "FROM tasks WHERE task_id = ?", (task_id,)).fetchone()
        if row is None:
            raise UnknownTask(task_id)
        return row

    def _frozen_seq(self, task_id: str) -> int:
        seq = self._state(task_id)[0]
        if seq is None:
            raise CollectionOpen(task_id)
        return seq

    def add_task(self, task_id: str, config: str, fingerprint: bytes, seed: bytes) -> str | None:
        """Stores a task; returns None if new or identical, else the existing config (a conflict)."""
        with self._transaction():
            row = self.db.execute("SELECT config FROM tasks WHERE task_id = ?", (task_id,)).fetchone()
            if row:
                return None if row[0] == config else row[0]
            self.db.execute("INSERT INTO tasks (task_id, config, fingerprint, noise_seed, created) VALUES (?, ?, ?, ?, ?)",
                            (task_id, config, bytes(fingerprint), bytes(seed), time.time()))
            return None

    def task(self, task_id: str) -> tuple[str, bytes] | None:
        with self.lock:
            row = self.db.execute("SELECT config, noise_seed FROM tasks WHERE task_id = ?", (task_id,)).fetchone()
        return None if row is None else (row[0], bytes(row[1]))

    def frozen(self, task_id: str) -> Frozen | None:
        """(last report seq, count, hash of the report ids) once the task's collection is closed;
        None while it is open (or the task is unknown)."""
        with self.lock:
            row = self.db.execute("SELECT frozen_seq, report_count, set_hash FROM tasks WHERE task_id = ?",
                                  (task_id,)).fetchone()
        return None if row is None or row[0] is None else Frozen(*row)

    def freeze(self, task_id: str, set_hash: SetHash) -> Frozen:
        """Closes the task's collection (at the analyst's close): later uploads are refused and every
        answer comes from this set. Fixed per-node noise is only safe on a fixed data set: on a
        growing one, two answers' difference would be a new report's exact contribution.
        `set_hash(ids)` names the set (keyed: see protocols.reconciliation.maths). Idempotent: a second call returns the
        set fixed by the first (after any exclusions)."""
        with self._transaction():
            done = self.frozen(task_id)
            if done is not None:
                return done
            self._state(task_id)  # raises UnknownTask
            # the ids alone, then their last seq: a pair per row to Python cost 1.29 s of CPU per 10^6 reports, this 0.76 s
            early = self.db.execute("SELECT 1 FROM excluded WHERE task_id = ? LIMIT 1", (task_id,)).fetchone() is not None
            table = "counted" if early else "reports"  # ids two contents claimed (`add_many`) are out of the set from the start
            ids = list(chain.from_iterable(self.db.execute(f"SELECT report_id FROM {table} WHERE task_id = ? ORDER BY report_id",
                                                           (task_id,))))
            first, last = self.db.execute("SELECT coalesce(min(seq), 1), coalesce(max(seq), 0) FROM reports WHERE task_id = ?",
                                          (task_id,)).fetchone()
            self._first[task_id] = first  # seqs only grow (AUTOINCREMENT): a lower bound for good
            fixed = Frozen(last, len(ids), set_hash(ids))
            self.db.execute("UPDATE tasks SET frozen_seq = ?, report_count = ?, set_hash = ?, closed_at = ? WHERE task_id = ?",
                            (*fixed, time.time(), task_id))
            clean = self.db.execute("SELECT 1 FROM excluded WHERE task_id = ? LIMIT 1", (task_id,)).fetchone() is None
        if clean:  # committed, and nothing excluded yet: these sorted ids are `reconciled_ids` (read once, not twice)
            self._reconciled[task_id] = ids
        return fixed

    def _before_first(self, task_id: str) -> int:
        """One less than the task's first sequence number: where a scan of its rows in table order
        starts (the range keeps SQLite on the rowid, not the whole table)."""
        first = self._first.get(task_id) or self.db.execute("SELECT min(seq) FROM reports WHERE task_id = ?",
                                                             (task_id,)).fetchone()[0]
        return (first or 1) - 1

    def frozen_ids(self, task_id: str) -> list[bytes]:
        """The report ids of the closed set (excluded ones left out), in upload order. Raises
        CollectionOpen while the collection is open. (A scan of the table's rows in order: through
        the (task, id) index it was a sort of every id, 3x slower at 10^6.)"""
        with self.lock:
            seq = self._frozen_seq(task_id)
            return [bytes(r[0]) for r in self.db.execute(
                "SELECT report_id FROM counted WHERE seq > ? AND seq <= ? AND +task_id = ? ORDER BY seq",
                (self._before_first(task_id), seq, task_id))]

    def exclude(self, task_id: str, ids: Sequence[bytes], set_hash: SetHash, reason: str | None = None) -> Frozen:
        """Drops reports from the closed set (they stay stored), before any answer: after one, a
        smaller set would let two answers differ by the dropped reports' exact contribution.
        Recomputes the set's count and hash in the same transaction; raises AlreadyAnswered after
        an answer and CollectionOpen before the close. `reason`: None for the reconciliation's
        drops, else the report check's reason class (an id already excluded keeps its first reason)."""
        with self._transaction():
            seq, _, _, _, answered = self._state(task_id)
            if seq is None:
                raise CollectionOpen(task_id)
            if answered is not None:
                raise AlreadyAnswered(task_id)
            self._reconciled.pop(task_id, None)
            self.db.executemany("INSERT OR IGNORE INTO excluded (task_id, report_id, reason) VALUES (?, ?, ?)",
                                ((task_id, bytes(i), reason) for i in ids))
            kept = self.frozen_ids(task_id)
            fixed = Frozen(seq, len(kept), set_hash(kept))
            self.db.execute("UPDATE tasks SET report_count = ?, set_hash = ? WHERE task_id = ?", (fixed.count, fixed.digest, task_id))
            return fixed

    def lifecycle(self, task_id: str) -> Lifecycle | None:
        """The task's phase, times, DONE and restore mark in one query (`storage.lifecycle`, which says
        where each comes from and what each allows); None for an unknown task."""
        with self.lock:
            row = self.db.execute(select(self.restored) + " WHERE t.task_id = ?", (task_id,)).fetchone()
        return None if row is None else Lifecycle.from_row(row)

    def lifecycles(self) -> list[Lifecycle]:
        """Every task's `lifecycle`, in the order they were registered (one query)."""
        with self.lock:
            rows = self.db.execute(select(self.restored) + " ORDER BY t.created").fetchall()
        return [Lifecycle.from_row(r) for r in rows]

    def marked(self, task_id: str, mark: Mark | str) -> bool:
        """Whether the task reached a milestone (a `Mark` or its value): 'frozen' (its collection is
        closed), 'reconciled' (its close is done), 'answered'. An unknown mark raises ValueError."""
        Mark.parse(mark)
        life = self.lifecycle(task_id)
        return life is not None and life.reached(mark)

    def mark_purged(self, task_id: str, reason: str) -> None:
        """A purge's transition (`storage.retention`), in one transaction: marks the task purged for
        `reason` (purged_at, purge_reason) and deletes its round-one batches, segment records and journal
        but its DONE; for a gone reason also its histogram share, fixed designs, exclusions and query log,
        overwrites its noise seed, and closes a still open collection on no report set. A gone task, or
        the same reason again, changes nothing. Raises UnknownTask. (The caller turns secure_delete on.)"""
        with self._transaction() as db:
            life = self.lifecycle(task_id)
            if life is None:
                raise UnknownTask(task_id)
            if not (life.gone or life.purge_reason == reason):
                for table in ("check_batches", "segments"):
                    db.execute(f"DELETE FROM {table} WHERE task_id = ?", (task_id,))
                db.execute("DELETE FROM exchanges WHERE task_id = ? AND kind != ?", (task_id, DONE_KIND))
                now = time.time()
                if reason in GONE:
                    for table in ("histograms", "releases", "excluded", "queries"):
                        db.execute(f"DELETE FROM {table} WHERE task_id = ?", (task_id,))
                    db.execute("UPDATE tasks SET noise_seed = ? WHERE task_id = ?", (secrets.token_bytes(32), task_id))
                    if life.collecting:  # its collection closes, on no report set: later uploads are refused
                        db.execute("UPDATE tasks SET frozen_seq = 0, report_count = 0, set_hash = '', closed_at = ? "
                                   "WHERE task_id = ?", (now, task_id))
                db.execute("UPDATE tasks SET purged_at = ?, purge_reason = ? WHERE task_id = ?", (now, reason, task_id))
        self._reconciled.pop(task_id, None)

    def fixed_designs(self, task_id: str) -> set[str]:
        """The release kinds whose design a query fixed for the task (`fix_release`)."""
        with self.lock:
            return {k for (k,) in self.db.execute("SELECT kind FROM releases WHERE task_id = ?", (task_id,))}

    def mark(self, task_id: str, mark: Mark | str) -> None:
        """Records that the closed task reached 'reconciled' or 'answered' (once; later calls keep
        the first time). 'frozen' is set only by `freeze`; an unknown mark raises ValueError, an
        open collection CollectionOpen."""
        mark = Mark.parse(mark)
        if mark is Mark.FROZEN:
            raise ValueError("the 'frozen' mark is set by Store.freeze, which fixes the report set")
        column = MARK_COLUMN[mark]
        with self._transaction():
            self._frozen_seq(task_id)
            self.db.execute(f"UPDATE tasks SET {column} = ? WHERE task_id = ? AND {column} IS NULL", (time.time(), task_id))

    def add_reports(self, task_id: str, items: Sequence[tuple[bytes, bytes]]) -> list[bool]:
        """`add_many` item by item in one committed transaction: False where the id was already there
        (a replay: stored once, counted once). Raises CollectionClosed once the collection is closed."""
        with self._transaction():
            return [self.add_many(task_id, [item]) == 1 for item in items]

    def add_many(self, task_id: str, items: Sequence[tuple[bytes, bytes]], taken: list[int] | None = None) -> int:
        """Inserts (report id, key share) pairs in one committed transaction; returns how many were new. `taken`
        (if given) gets the index of each item whose id holds another share (issue 42), compared in constant time."""
        with self._transaction():
            if self._state(task_id)[0] is not None:
                raise CollectionClosed(task_id)
            now, before = time.time(), self.db.total_changes
            self.db.executemany("INSERT OR IGNORE INTO reports (task_id, report_id, key_share, received) VALUES (?, ?, ?, ?)",
                                ((task_id, bytes(rid), bytes(share), now) for rid, share in items))
            added = self.db.total_changes - before
            if taken is not None and added < len(items):  # some ids were stored: by these very bytes, or by others
                have = self.shares_by_id(task_id, [rid for rid, _ in items])
                clash = [i for i, ((_, share), had) in enumerate(zip(items, have)) if not compare_digest(had, bytes(share))]
                taken += clash
                # an id two contents claimed counts for neither (review of issue 42): out of this server's set (a reconciliation
                # drop, before the freeze), so the close drops it on both, as the client was told (not garbage, unverified)
                self.db.executemany("INSERT OR IGNORE INTO excluded (task_id, report_id, reason) VALUES (?, ?, NULL)",
                                    ((task_id, bytes(items[i][0])) for i in clash))
                if clash:
                    self._reconciled.pop(task_id, None)
            return added

    def rejections(self, task_id: str) -> dict[str, int]:
        """How many reports the report check excluded, per reason class (reconciliation drops not
        included)."""
        with self.lock:
            rows = self.db.execute("SELECT reason, COUNT(*) FROM excluded WHERE task_id = ? AND reason IS NOT NULL "
                                   "GROUP BY reason ORDER BY reason", (task_id,)).fetchall()
        return {r[0]: r[1] for r in rows}

    def reconciled_ids(self, task_id: str) -> list[bytes]:
        """The report ids of the closed set before the report check (only the reconciliation's drops
        left out), sorted: the set both servers check, in the order both use. Kept in memory until
        the task's next exclusion: a close reads it several times (each reconciliation step, the
        check), a second at 10^6 reports each time."""
        with self.lock:
            seq = self._frozen_seq(task_id)
            if task_id not in self._reconciled:
                self._reconciled[task_id] = [bytes(r[0]) for r in self.db.execute(
                    "SELECT report_id FROM reports WHERE task_id = ? AND seq <= ? AND report_id NOT IN "
                    "(SELECT report_id FROM excluded WHERE task_id = ? AND reason IS NULL) ORDER BY report_id",
                    (task_id, seq, task_id))]
            return list(self._reconciled[task_id])

    def shares_by_id(self, task_id: str, ids: Sequence[bytes]) -> list[bytes]:
        """The stored shares of these report ids, in the given order (KeyError for one not stored)."""
        out = []
        with self.lock:
            for rid in ids:
                row = self.db.execute("SELECT key_share FROM reports WHERE task_id = ? AND report_id = ?",
                                      (task_id, bytes(rid))).fetchone()
                if row is None:
                    raise KeyError(rid.hex())
                out.append(bytes(row[0]))
        return out

    def checked_count(self, task_id: str) -> int:
        """How many of the task's reports its stored round-one batches hold (the check's progress)."""
        with self.lock:
            return self.db.execute("SELECT coalesce(sum(n), 0) FROM check_batches WHERE task_id = ?", (task_id,)).fetchone()[0]

    def checked_upto(self, task_id: str) -> int:
        """The last sequence number the task's stored round-one batches cover (0 if none)."""
        with self.lock:
            return self.db.execute("SELECT coalesce(max(last_seq), 0) FROM check_batches WHERE task_id = ?", (task_id,)).fetchone()[0]

    def unchecked(self, task_id: str, limit: int, after: int | None = None) -> tuple[list[int], list[bytes], list[bytes]]:
        """(seqs, ids, shares) of the task's next `limit` reports after `checked_upto` (or after seq
        `after`: a reader ahead of the stored batches), in upload order (up to the frozen set's last one
        once the collection is closed)."""
        with self.lock:
            rows = self.db.execute("SELECT seq, report_id, key_share " + _UNCHECKED, self._unchecked(task_id, after, limit)).fetchall()
        return [r[0] for r in rows], [bytes(r[1]) for r in rows], [bytes(r[2]) for r in rows]

    def unchecked_count(self, task_id: str, limit: int) -> int:
        """How many of the task's reports after `checked_upto` there are, counting up to `limit` (no share read)."""
        with self.lock:
            return self.db.execute("SELECT count(*) FROM (SELECT 1 " + _UNCHECKED + ")", self._unchecked(task_id, None, limit)).fetchone()[0]

    def unchecked_joined(self, task_id: str, limit: int, after: int | None = None) -> tuple[list[int], bytes, bytes, set]:
        """`unchecked` as ([first seq, last seq] or [], the ids end to end, the shares end to end, the
        shares' lengths), joined by SQLite as in `share_blocks`: round one on Dask sends one object a batch."""
        with self.lock:
            n, lo, hi, low, high, ids, shares = self.db.execute(
                "SELECT count(*), min(seq), max(seq), min(length(key_share)), max(length(key_share)), CAST(group_concat(report_id, '') "
                "AS BLOB), CAST(group_concat(key_share, '') AS BLOB) FROM (SELECT seq, report_id, key_share "
                + _UNCHECKED + ")", self._unchecked(task_id, after, limit)).fetchone()
        return ([lo, hi] if n else []), bytes(ids or b""), bytes(shares or b""), {low, high} - {None}

    def _unchecked(self, task_id: str, after: int | None, limit: int) -> tuple:
        """The parameters of `_UNCHECKED` (under the lock): plain bounds, no subquery in the range."""
        after, frozen = self.checked_upto(task_id) if after is None else after, self._state(task_id)[0]
        return task_id, after or 0, frozen if frozen is not None else 2**62, int(limit)  # (reports_by_task: no start to find)

    def add_check_batch(self, task_id: str, batch: CheckBatch) -> bool:
        """Stores a round-one batch if it starts after `checked_upto` (else a concurrent or earlier run
        stored it) and the task is not purged (a batch computed during the purge, on Dask several are in
        flight, would outlive it: review of issue 24); returns whether it was stored."""
        with self._transaction():
            life = self.lifecycle(task_id)
            if batch.first_seq <= self.checked_upto(task_id) or life is None or life.purge_reason is not None:
                return False
            self.db.execute("INSERT INTO check_batches VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                            (task_id, *batch[:3], *(bytes(b) for b in batch[3:])))
            return True

    def check_batches(self, task_id: str) -> list[CheckBatch]:
        """The task's round-one batches, in sequence order."""
        with self.lock:
            rows = self.db.execute("SELECT first_seq, last_seq, n, ids, message, state, extras, sums FROM check_batches "
                                   "WHERE task_id = ? ORDER BY first_seq", (task_id,)).fetchall()
        return [CheckBatch(*r[:3], *(bytes(b) for b in r[3:])) for r in rows]

    def dropped_ids(self, task_id: str) -> list[bytes]:
        """The reports the reconciliation dropped (excluded with no reason class)."""
        with self.lock:
            return [bytes(r[0]) for r in self.db.execute(
                "SELECT report_id FROM excluded WHERE task_id = ? AND reason IS NULL", (task_id,))]

    def tasks_to_check(self) -> list[tuple[str, str]]:
        """(task id, config JSON) of every task whose report check is not done (verified or not)."""
        with self.lock:
            return [(r[0], r[1]) for r in self.db.execute("SELECT task_id, config FROM tasks WHERE verified_at IS NULL")]

    def save_histogram(self, task_id: str, set_hash: str, shape: tuple[int, ...], data: bytes) -> bool:
        """Keeps this server's share of a task's histogram for the report set `set_hash`; not for a task whose
        reports are gone (one made while a purge ran would outlive it). Returns whether it was stored."""
        with self._transaction():
            life = self.lifecycle(task_id)
            if life is None or life.gone:
                return False
            self.db.execute("INSERT OR REPLACE INTO histograms VALUES (?, ?, ?, ?, ?)",
                            (task_id, set_hash, ",".join(map(str, shape)), bytes(data), time.time()))
            return True

    def histogram(self, task_id: str) -> tuple[str, tuple[int, ...], bytes] | None:
        """(set hash, shape, bytes) of the task's stored histogram share, or None."""
        with self.lock:
            row = self.db.execute("SELECT set_hash, shape, data FROM histograms WHERE task_id = ?", (task_id,)).fetchone()
        return None if row is None else (row[0], tuple(int(v) for v in row[1].split(",")), bytes(row[2]))

    def holds(self, task_id: str, n: int) -> bool:
        """Whether the task has at least n stored reports (reads at most n index entries, not all)."""
        with self.lock:
            return self.db.execute("SELECT count(*) FROM (SELECT 1 FROM reports WHERE task_id = ? LIMIT ?)",
                                   (task_id, int(n))).fetchone()[0] >= n

    def count(self, task_id: str) -> int:
        """How many distinct reports the task has stored (excluded ones included)."""
        with self.lock:
            return self.db.execute("SELECT COUNT(*) FROM reports WHERE task_id = ?", (task_id,)).fetchone()[0]

    def shares_since(self, task_id: str, seq: int, upto: int) -> tuple[list[bytes], int]:
        """The key shares with seq in (seq, upto], excluded ones left out, in order, and the last
        seq read (`seq` if none)."""
        with self.lock:
            rows = self.db.execute("SELECT seq, key_share FROM counted WHERE seq > ? AND seq <= ? AND +task_id = ? ORDER BY seq",
                                   (seq, upto, task_id)).fetchall()
        return [bytes(r[1]) for r in rows], (rows[-1][0] if rows else seq)

    def fix_release(self, task_id: str, kind: str, params: str) -> str:
        """Records the parameters of a one-off release the first time; returns the recorded ones
        (so a different later request can be refused: it would spend budget again)."""
        with self._transaction():
            self.db.execute("INSERT OR IGNORE INTO releases VALUES (?, ?, ?, ?)", (task_id, kind, params, time.time()))
            return self.db.execute("SELECT params FROM releases WHERE task_id = ? AND kind = ?", (task_id, kind)).fetchone()[0]

    def log_query(self, task_id: str, kind: str, points: int) -> None:
        with self._transaction():
            self.db.execute("INSERT INTO queries VALUES (?, ?, ?, ?)", (task_id, time.time(), kind, int(points)))

    def record_segments(self, task_id: str, files: Sequence[SegmentFile]) -> None:
        """Records a reconciled task's segment files, replacing any earlier record, in one
        transaction. Raises CollectionOpen before the close, StoreError unless the task is
        reconciled and every file names its current report set (a stale rebuild is refused)."""
        with self._transaction():
            digest = self._state(task_id)[2]
            if digest is None:
                raise CollectionOpen(task_id)
            if not self.marked(task_id, Mark.RECONCILED):
                raise StoreError(f"task {task_id} is not reconciled: its key shares may still change")
            if any(f.set_hash != digest for f in files):
                raise StoreError(f"segments of another report set than task {task_id}'s")
            self.db.execute("DELETE FROM segments WHERE task_id = ?", (task_id,))
            now = time.time()
            self.db.executemany("INSERT INTO segments (task_id, shard, array, n, file, sha256, set_hash, written) "
                                "VALUES (?, ?, ?, ?, ?, ?, ?, ?)", ((task_id, *f, now) for f in files))

    def exchange(self, task_id: str, role: str, kind: int, chunk: int) -> Exchange | None:
        """The journalled step (request, answer) of this role, message kind and chunk, or None."""
        with self.lock:
            row = self.db.execute("SELECT request, answer FROM exchanges WHERE task_id = ? AND role = ? AND kind = ? "
                                  "AND chunk = ?", (task_id, role, int(kind), int(chunk))).fetchone()
        return None if row is None else Exchange(bytes(row[0]), bytes(row[1]))

    def record_exchange(self, task_id: str, role: str, kind: int, chunk: int, request: bytes, answer: bytes) -> Exchange:
        """Journals a step unless one is there already (committed before the answer leaves this
        server); returns the stored step, the earlier one if two raced: the caller must send that."""
        with self._transaction():
            self.db.execute("INSERT OR IGNORE INTO exchanges VALUES (?, ?, ?, ?, ?, ?, ?)",
                            (task_id, role, int(kind), int(chunk), bytes(request), bytes(answer), time.time()))
            stored = self.exchange(task_id, role, kind, chunk)
            if stored is None:  # the row was just written, or was there: never, short of a foreign key failure
                raise StoreError(f"task {task_id}: the journalled step ({role}, {kind}, {chunk}) is not in the store")
            return stored

    def exchanged(self, task_id: str, role: str, kinds: Sequence[int]) -> int:
        """How many steps of these message kinds this role has journalled for the task."""
        marks = ",".join("?" * len(kinds))
        with self.lock:
            return self.db.execute(f"SELECT COUNT(*) FROM exchanges WHERE task_id = ? AND role = ? AND kind IN ({marks})",
                                   (task_id, role, *map(int, kinds))).fetchone()[0]

    def segments(self, task_id: str) -> list[SegmentFile]:
        """The task's recorded segment files, by shard then array name (empty if none)."""
        with self.lock:
            rows = self.db.execute("SELECT shard, array, n, file, sha256, set_hash FROM segments WHERE task_id = ? "
                                   "ORDER BY shard, array", (task_id,)).fetchall()
        return [SegmentFile(*r) for r in rows]

    def drop_segments(self, task_id: str) -> None:
        """Forgets the task's segment files (their files are the caller's to remove)."""
        with self._transaction():
            self.db.execute("DELETE FROM segments WHERE task_id = ?", (task_id,))

    def share_chunks(self, task_id: str, upto: int, size: int) -> Iterator[list[bytes]]:
        """The key shares with seq <= `upto`, excluded ones left out, in order, in lists of at most
        `size` (so a large task is never all in memory as Python objects). `+task_id` keeps SQLite on
        the rowid range: through the (task, id) index every chunk re-sorted the task's rows (200,000
        reports: 17.5 s, against 1.2 s as a range scan)."""
        seq = 0
        while True:
            with self.lock:
                rows = self.db.execute("SELECT seq, key_share FROM counted WHERE seq > ? AND seq <= ? AND +task_id = ? "
                                       "ORDER BY seq LIMIT ?", (seq, upto, task_id, int(size))).fetchall()
            if not rows:
                return
            seq = rows[-1][0]
            yield [r[1] for r in rows]

    def share_blocks(self, task_id: str, upto: int, span: int, size: int | None = None) -> Iterator[tuple[int, bytes]]:
        """The key shares with seq <= `upto`, excluded ones left out, in order, as (count, their bytes
        end to end): one block per `span` sequence numbers (so at most `span` shares; empty ranges are
        skipped), each read under the lock, none held between blocks. For the segments' build: a
        rowid range scan from the task's first row, the shares only, joined by SQLite (group_concat,
        byte for byte in a UTF-8 database: one value per block, where a row per share to Python and
        a join cost 1.8 s of CPU per 10^6 shares of 420 bytes, this 1.0 s; in seq order because SQLite
        never flattens an ORDER BY subquery into an aggregate, as group_concat takes no ORDER BY of
        its own before SQLite 3.44, and test_store checks the order); with `size`, StoreError
        unless every share is `size` bytes (each was checked at upload). The `counted` view's rule, as a list
        subquery, and only if the task has exclusions: SQLite runs the view's correlated NOT EXISTS
        once per row, which cost about 0.5 s more per 10^6 rows (`tests/service/test_store.py` holds
        the two to the same rows)."""
        with self.lock:
            seq = self._before_first(task_id)
            upto = min(upto, self.db.execute("SELECT coalesce(max(seq), 0) FROM reports").fetchone()[0])
        while seq < upto:
            end = min(seq + int(span), upto)
            with self.lock:
                some = self.db.execute("SELECT 1 FROM excluded WHERE task_id = ? LIMIT 1", (task_id,)).fetchone()
                n, low, high, blob = self.db.execute(
                    "SELECT count(*), min(length(key_share)), max(length(key_share)), CAST(group_concat(key_share, '') "
                    "AS BLOB) FROM (SELECT key_share FROM reports WHERE seq > ?1 AND seq <= ?2 AND +task_id = ?3" + (
                        " AND report_id NOT IN (SELECT report_id FROM excluded WHERE task_id = ?3)" if some else "")
                    + " ORDER BY seq)", (seq, end, task_id)).fetchone()
            seq = end
            if n:
                if size is not None and not low == high == size:
                    raise StoreError(f"task {task_id}: a stored key share is not {size} bytes")
                yield n, blob
