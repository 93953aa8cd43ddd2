"""A server's durable state in SQLite (WAL, synchronous=FULL): tasks with their secret noise seeds,
key shares (acknowledged only after the transaction commits), report ids for replay protection, and
the query log."""
from __future__ import annotations

import os
import sqlite3
import threading
import time
from pathlib import Path

class CollectionClosed(Exception):
    """The task's collection is closed: its report set is fixed."""


class AlreadyAnswered(Exception):
    """The task has answered a query: its report set can no longer shrink."""


SCHEMA = """
CREATE TABLE IF NOT EXISTS tasks (task_id TEXT PRIMARY KEY, config TEXT NOT NULL, fingerprint BLOB NOT NULL,
                                  noise_seed BLOB NOT NULL, created REAL NOT NULL);
CREATE TABLE IF NOT EXISTS reports (seq INTEGER PRIMARY KEY AUTOINCREMENT, task_id TEXT NOT NULL,
                                    report_id BLOB NOT NULL, key_share BLOB NOT NULL, received REAL NOT NULL,
                                    UNIQUE (task_id, report_id));
CREATE TABLE IF NOT EXISTS releases (task_id TEXT NOT NULL, kind TEXT NOT NULL, params TEXT NOT NULL,
                                     PRIMARY KEY (task_id, kind));
CREATE TABLE IF NOT EXISTS excluded (task_id TEXT NOT NULL, report_id BLOB NOT NULL, PRIMARY KEY (task_id, report_id));
CREATE TABLE IF NOT EXISTS queries (task_id TEXT NOT NULL, at REAL NOT NULL, kind TEXT NOT NULL, points INTEGER NOT NULL);
"""


class Store:
    def __init__(self, path: Path):
        new = not path.exists()
        self.db = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None)
        if new:
            os.chmod(path, 0o600)  # it holds noise seeds and key shares
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=FULL")
        self.db.executescript(SCHEMA)
        self.lock = threading.RLock()  # handlers run in a thread pool; one connection, one writer at a time

    def add_task(self, task_id: str, config: str, fingerprint: bytes, seed: bytes) -> str | None:
        """Stores a task; returns None if new or identical, else the existing config (a conflict)."""
        with self.lock:
            row = self.db.execute("SELECT config FROM tasks WHERE task_id = ?", (task_id,)).fetchone()
            if row:
                return None if row[0] == config else row[0]
            self.db.execute("INSERT INTO tasks VALUES (?, ?, ?, ?, ?)", (task_id, config, fingerprint, seed, time.time()))
            return None

    def task(self, task_id: str) -> tuple[str, bytes] | None:
        with self.lock:
            row = self.db.execute("SELECT config, noise_seed FROM tasks WHERE task_id = ?", (task_id,)).fetchone()
        return None if row is None else (row[0], bytes(row[1]))

    def frozen(self, task_id: str) -> tuple[int, int, str] | None:
        """(last report seq, count, hash of the report ids) once the task's collection is closed."""
        with self.lock:
            row = self.db.execute("SELECT params FROM releases WHERE task_id = ? AND kind = 'frozen'", (task_id,)).fetchone()
        if row is None:
            return None
        seq, count, digest = row[0].split(":")
        return int(seq), int(count), digest

    def freeze(self, task_id: str, set_hash) -> tuple[int, int, str]:
        """Closes the task's collection (at the analyst's close): later uploads are refused and every
        answer comes from this set. Fixed per-node noise is only safe on a fixed data set: on a
        growing one, two answers' difference would be a new report's exact contribution.
        `set_hash(ids)` names the set (keyed: see reconcile)."""
        with self.lock:
            done = self.frozen(task_id)
            if done is not None:
                return done
            rows = self.db.execute("SELECT seq, report_id FROM reports WHERE task_id = ?", (task_id,)).fetchall()
            seq = max((r[0] for r in rows), default=0)
            digest = set_hash([bytes(r[1]) for r in rows])
            self.db.execute("INSERT INTO releases VALUES (?, 'frozen', ?)", (task_id, f"{seq}:{len(rows)}:{digest}"))
            return seq, len(rows), digest

    def frozen_ids(self, task_id: str) -> list[bytes]:
        """The report ids of the closed set (excluded ones left out)."""
        with self.lock:
            return [bytes(r[0]) for r in self.db.execute(
                "SELECT report_id FROM reports WHERE task_id = ? AND seq <= ? AND report_id NOT IN "
                "(SELECT report_id FROM excluded WHERE task_id = ?)", (task_id, self.frozen(task_id)[0], task_id))]

    def exclude(self, task_id: str, ids: list[bytes], set_hash) -> tuple[int, int, str]:
        """Drops reports from the closed set (they stay stored), before any answer: after one, a
        smaller set would let two answers differ by the dropped reports' exact contribution."""
        with self.lock:
            if self.marked(task_id, "answered"):
                raise AlreadyAnswered(task_id)
            seq = self.frozen(task_id)[0]
            self.db.execute("BEGIN IMMEDIATE")
            try:
                self.db.executemany("INSERT OR IGNORE INTO excluded VALUES (?, ?)", ((task_id, i) for i in ids))
                kept = self.frozen_ids(task_id)
                params = f"{seq}:{len(kept)}:{set_hash(kept)}"
                self.db.execute("UPDATE releases SET params = ? WHERE task_id = ? AND kind = 'frozen'", (params, task_id))
                self.db.execute("COMMIT")
            except BaseException:
                self.db.execute("ROLLBACK")
                raise
            return seq, len(kept), params.split(":")[2]

    def marked(self, task_id: str, mark: str) -> bool:
        """Whether the task reached a milestone: 'reconciled' (its close is done), 'answered'."""
        with self.lock:
            return self.db.execute("SELECT 1 FROM releases WHERE task_id = ? AND kind = ?", (task_id, mark)).fetchone() is not None

    def mark(self, task_id: str, mark: str) -> None:
        with self.lock:
            self.db.execute("INSERT OR IGNORE INTO releases VALUES (?, ?, '')", (task_id, mark))

    def add_reports(self, task_id: str, items: list[tuple[bytes, bytes]]) -> list[bool]:
        """Inserts (report id, key share) pairs in one committed transaction; False where the id
        was already there (a replay: stored once, counted once). Raises CollectionClosed once the
        task's collection is closed."""
        now = time.time()
        with self.lock:
            if self.frozen(task_id) is not None:
                raise CollectionClosed(task_id)
            self.db.execute("BEGIN IMMEDIATE")
            try:
                added = []
                for rid, share in items:
                    cur = self.db.execute("INSERT OR IGNORE INTO reports (task_id, report_id, key_share, received) "
                                          "VALUES (?, ?, ?, ?)", (task_id, rid, share, now))
                    added.append(cur.rowcount == 1)
                self.db.execute("COMMIT")
            except BaseException:
                self.db.execute("ROLLBACK")
                raise
        return added

    def add_many(self, task_id: str, items: list[tuple[bytes, bytes]]) -> int:
        """Like add_reports in one committed transaction; returns how many were new."""
        now = time.time()
        with self.lock:
            if self.frozen(task_id) is not None:
                raise CollectionClosed(task_id)
            before = self.db.total_changes
            self.db.execute("BEGIN IMMEDIATE")
            try:
                self.db.executemany("INSERT OR IGNORE INTO reports (task_id, report_id, key_share, received) VALUES (?, ?, ?, ?)",
                                    ((task_id, rid, share, now) for rid, share in items))
                self.db.execute("COMMIT")
            except BaseException:
                self.db.execute("ROLLBACK")
                raise
            return self.db.total_changes - before

    def count(self, task_id: str) -> int:
        with self.lock:
            return self.db.execute("SELECT COUNT(*) FROM reports WHERE task_id = ?", (task_id,)).fetchone()[0]

    def shares_since(self, task_id: str, seq: int, upto: int) -> tuple[list[bytes], int]:
        with self.lock:
            rows = self.db.execute("SELECT seq, key_share FROM reports WHERE task_id = ? AND seq > ? AND seq <= ? AND report_id "
                                   "NOT IN (SELECT report_id FROM excluded WHERE task_id = ?) ORDER BY seq",
                                   (task_id, seq, upto, task_id)).fetchall()
        return [bytes(r[1]) for r in rows], (rows[-1][0] if rows else seq)

    def fix_release(self, task_id: str, kind: str, params: str) -> str:
        """Records the parameters of a one-off release the first time; returns the recorded ones
        (so a different later request can be refused: it would spend budget again)."""
        with self.lock:
            self.db.execute("INSERT OR IGNORE INTO releases VALUES (?, ?, ?)", (task_id, kind, params))
            return self.db.execute("SELECT params FROM releases WHERE task_id = ? AND kind = ?", (task_id, kind)).fetchone()[0]

    def log_query(self, task_id: str, kind: str, points: int) -> None:
        with self.lock:
            self.db.execute("INSERT INTO queries VALUES (?, ?, ?, ?)", (task_id, time.time(), kind, points))
