"""A client's spool: every report it made, on disk before anything is sent, and which server has
acknowledged which report.

Why: a report is a random DCF key pair under a random id. If a client made new reports after a crash
(of a server, of the network, of itself), a value already stored on one server would be counted again
under a new id. With the spool, a report, once made, is the same bytes forever: a re-run uploads only
what a server has not acknowledged, and a server that already stored a report answers "duplicate",
which counts as an acknowledgement. So nothing acknowledged is lost and nothing is counted twice.

The spool is SQLite (WAL, synchronous=FULL: a committed row survives a power cut) holding the task's
fingerprint and a digest of the input it covers; a spool opened for another task or another input is
refused with `SpoolMismatch` rather than silently mixed. Report rows are written in order and in whole
transactions, so a spool interrupted while reports were being made resumes at the first missing row.
The spool holds sealed reports only (each share encrypted to its server): no plaintext value or key.
"""
from __future__ import annotations

import fcntl
import hashlib
import os
import sqlite3
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import numpy as np

from ..errors import DpcdfError
from .files import create_private

SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS reports (row INTEGER PRIMARY KEY, report_id BLOB NOT NULL UNIQUE, body BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS acks (row INTEGER NOT NULL, party INTEGER NOT NULL CHECK (party IN (0, 1)),
                                 rejected TEXT, PRIMARY KEY (row, party));
"""


class SpoolMismatch(DpcdfError):
    """The spool belongs to another task or was made from another input."""


class SpoolBusy(DpcdfError):
    """Another process is using the spool (two uploads of one input at once would race)."""


@dataclass(frozen=True)
class SpoolStatus:
    """Counts over the input's rows: `complete` acknowledged by both servers, `rejected` refused by
    at least one (never sent again), `pending` the rest (a re-run sends them)."""

    rows: int
    spooled: int
    complete: int
    pending: int
    rejected: int


def input_digest(values: np.ndarray, labels: np.ndarray | None) -> bytes:
    """What the spool covers: the input rows, exactly (float64 values, and labels if any)."""
    h = hashlib.sha256(b"dpcdf/spool-input/v1")
    h.update(len(values).to_bytes(8, "little"))
    h.update(np.ascontiguousarray(values, dtype="<f8").tobytes())
    if labels is not None:
        h.update(b"labels")
        h.update(np.ascontiguousarray(labels, dtype="<i8").tobytes())
    return h.digest()


class Spool:
    """The reports for one input of one task. `Spool.open(path, fingerprint, values, labels)` creates
    the file or checks that it matches; ":memory:" keeps it in memory (no crash safety)."""

    def __init__(self, db: sqlite3.Connection, path: str, rows: int, lock: int | None = None):
        self.db, self.path, self.rows, self._lock = db, path, rows, lock

    @classmethod
    def open(cls, path: str | Path, fingerprint: bytes, values: np.ndarray, labels: np.ndarray | None = None) -> "Spool":
        path = str(path)
        lock = None if path == ":memory:" else _exclusive(os.path.realpath(path) + ".lock")  # one lock per file, links too
        if path != ":memory:":
            create_private(path)
        db = sqlite3.connect(path, isolation_level=None)
        if path != ":memory:":
            db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=FULL")
        db.executescript(SCHEMA)
        spool = cls(db, path, len(values), lock)
        digest = input_digest(values, labels)
        try:
            spool._check(fingerprint, digest, len(values))
        except BaseException:
            spool.close()
            raise
        return spool

    def _check(self, fingerprint: bytes, digest: bytes, rows: int) -> None:
        db, path = self.db, self.path
        with self._transaction():
            meta = dict(db.execute("SELECT name, value FROM meta").fetchall())
            if not meta:
                db.executemany("INSERT INTO meta VALUES (?, ?)", [("fingerprint", fingerprint), ("input", digest),
                                                                  ("rows", str(rows))])
            elif bytes(meta["fingerprint"]) != fingerprint:
                raise SpoolMismatch(f"spool {path} holds reports for another task; choose another --spool")
            elif bytes(meta["input"]) != digest:
                raise SpoolMismatch(f"spool {path} was made from another input ({meta['rows']} rows, not these "
                                    f"{rows}); its reports would be mixed with new ones. Restore that input, "
                                    "or choose another --spool for this one")

    @contextmanager
    def _transaction(self) -> Iterator[None]:
        self.db.execute("BEGIN IMMEDIATE")
        try:
            yield
            self.db.execute("COMMIT")
        except BaseException:
            self.db.execute("ROLLBACK")
            raise

    def spooled(self) -> int:
        """Rows whose report is made and committed (always a prefix 0 .. k-1 of the input)."""
        return self.db.execute("SELECT COUNT(*) FROM reports").fetchone()[0]

    def add(self, first_row: int, reports: list[tuple[bytes, bytes]]) -> None:
        """Commits (report id, report bytes) for rows first_row, first_row + 1, ... in one transaction."""
        try:
            with self._transaction():
                self.db.executemany("INSERT INTO reports VALUES (?, ?, ?)",
                                    ((first_row + i, rid, body) for i, (rid, body) in enumerate(reports)))
        except sqlite3.IntegrityError:  # only another writer gets here: rows are never made twice
            raise SpoolBusy(f"{self.path}: rows {first_row}.. were spooled by another process meanwhile") from None

    def unacknowledged(self, party: int, limit: int, after: int = -1) -> list[tuple[int, bytes]]:
        """Up to `limit` (row, report) after row `after` that server `party` has neither acknowledged
        nor rejected (one primary-key probe per row, so a whole upload stays linear in its rows)."""
        return [(r, bytes(b)) for r, b in self.db.execute(
            "SELECT row, body FROM reports AS r WHERE row > ? AND NOT EXISTS "
            "(SELECT 1 FROM acks AS a WHERE a.row = r.row AND a.party = ?) ORDER BY row LIMIT ?", (after, party, limit))]

    def acknowledged(self, party: int) -> int:
        """How many reports server `party` has acknowledged."""
        return self.db.execute("SELECT COUNT(*) FROM acks WHERE party = ? AND rejected IS NULL", (party,)).fetchone()[0]

    def record(self, party: int, acked: list[int], rejected: dict[int, str]) -> None:
        """Server `party`'s answer for some rows: stored (new or duplicate), or refused for good."""
        with self._transaction():
            self.db.executemany("INSERT OR REPLACE INTO acks VALUES (?, ?, NULL)", ((r, party) for r in acked))
            self.db.executemany("INSERT OR REPLACE INTO acks VALUES (?, ?, ?)", ((r, party, e) for r, e in rejected.items()))

    def rejections(self) -> list[tuple[int, int, str]]:
        """(row, party, reason) of every refused report."""
        return self.db.execute("SELECT row, party, rejected FROM acks WHERE rejected IS NOT NULL ORDER BY row").fetchall()

    def status(self) -> SpoolStatus:
        q = self.db.execute
        complete = q("SELECT COUNT(*) FROM (SELECT row FROM acks WHERE rejected IS NULL GROUP BY row HAVING COUNT(*) = 2)").fetchone()[0]
        rejected = q("SELECT COUNT(DISTINCT row) FROM acks WHERE rejected IS NOT NULL").fetchone()[0]
        return SpoolStatus(self.rows, self.spooled(), complete, self.rows - complete - rejected, rejected)

    def close(self) -> None:
        self.db.close()
        if self._lock is not None:
            os.close(self._lock)  # releases the flock
            self._lock = None


def _exclusive(path: str) -> int:
    """An exclusive, non-blocking flock on `path` (held until its descriptor is closed)."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise SpoolBusy(f"{path[:-5]} is in use by another upload of the same input; wait for it to end") from None
    return fd
