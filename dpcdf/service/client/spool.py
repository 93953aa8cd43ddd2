"""A client's spool: every report it made for a task, on disk before anything is sent, which input
row each one came from (by content), and which server has acknowledged which report.

Why: a report is a random DCF key pair under a random id. If a client made new reports after a crash
(of a server, of the network, of itself), a value already stored on one server would be counted again
under a new id. With the spool, a report, once made, is the same bytes forever: a re-run uploads only
what a server has not acknowledged, and a server that already stored a report answers "duplicate",
which counts as an acknowledgement. So nothing acknowledged is lost and nothing is counted twice.

One spool holds one task's reports from any number of inputs ("sources": a CSV file's path, or
--values). It remembers each report's row by a digest of the row's content (SHA-256 under a salt
kept in the spool, of the value, the label and the CSV row's fields) and its line in the source, and
`admit` matches an input against them, row by row (as multisets: two equal rows are two rows):
- rows already spooled from the same source are not made again (a re-run, or an input that extends
  what was spooled: only the new rows are made);
- rows equal to rows spooled from another source (a copied file, the same rows under another name)
  are refused with `DuplicateRows`, which names them, unless the caller allows duplicates;
- an input from a known source that neither holds all the rows spooled from it nor lies within them
  (the file changed) is a new version of that source: its rows are checked against every other source, the old
  version's included.
- a CSV row spooled before with another value (another --column or --label-column of the same row:
  the same person) is refused with `DuplicateRows` too: a task counts each row once. Each report also
  keeps a digest of its row's content alone for this (table `contents`, which a spool of an earlier
  dpcdf gains empty, and which earlier versions ignore).

The spool is SQLite (WAL, synchronous=FULL: a committed row survives a power cut). Reports are written
in whole transactions, so a spool interrupted while reports were being made resumes with the rows
it committed. It holds sealed reports (each share encrypted to its server) and row digests, which
identify a row as well as the row itself does to anyone who can guess it: the file is 0600, like the
input it sits beside. A spool opened for another task is refused with `SpoolMismatch`. One process
uses a spool at a time (a file lock); within it, the upload's threads share the one connection, each
method holding `Spool.mutex`.
"""
from __future__ import annotations

import functools
import hashlib
import os
import secrets
import sqlite3
import threading
from collections import defaultdict, deque
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np

from ...errors import DpcdfError
from ..files import create_private, exclusive_lock

VERSION = "2"
ANOTHER_COLUMN = " with another value column"  # how `DuplicateRows.rows` names a row spooled with another value
SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS sources (id INTEGER PRIMARY KEY, name TEXT NOT NULL, version INTEGER NOT NULL,
                                    UNIQUE (name, version));
CREATE TABLE IF NOT EXISTS reports (row INTEGER PRIMARY KEY, report_id BLOB NOT NULL UNIQUE, body BLOB NOT NULL,
                                    digest BLOB NOT NULL, source INTEGER NOT NULL, line INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS contents (row INTEGER PRIMARY KEY, content BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS acks (row INTEGER NOT NULL, party INTEGER NOT NULL CHECK (party IN (0, 1)),
                                 rejected TEXT, PRIMARY KEY (row, party));
"""


class SpoolMismatch(DpcdfError):
    """The spool belongs to another task, or was written by an older dpcdf."""


class SpoolBusy(DpcdfError):
    """Another process is using the spool (two uploads into one spool at once would race)."""


class DuplicateRows(DpcdfError):
    """Rows of the input equal rows already spooled for this task from another source. `rows` lists
    (line in the input, source, line there)."""

    def __init__(self, message: str, rows: list[tuple[int, str, int]]):
        super().__init__(message)
        self.rows = rows


@dataclass(frozen=True)
class SpoolStatus:
    """Counts over the spool's reports (every source): `complete` acknowledged by both servers,
    `rejected` refused by at least one (never sent again), `pending` the rest (a re-run sends them)."""

    rows: int
    spooled: int
    complete: int
    pending: int
    rejected: int


@dataclass
class Admission:
    """What `admit` decided for an input of `rows` rows: `new` (indices into the input) are to be
    made and spooled; `spooled` rows are already in the spool from this source; `duplicates` rows
    equal rows from other sources and are made again only because duplicates were allowed."""

    source: str
    source_id: int
    rows: int
    new: np.ndarray
    spooled: int
    duplicates: list[tuple[int, str, int]] = field(default_factory=list)
    new_version: bool = False


def row_digests(salt: bytes, values: np.ndarray, labels: np.ndarray | None = None,
                contents: Sequence[bytes] | None = None) -> list[bytes]:
    """One digest per input row: of its value (float64), its label and its content (a CSV row's fields)."""
    v = np.ascontiguousarray(values, dtype="<f8")
    out = []
    base = hashlib.sha256(b"dpcdf/spool-row/v2" + salt)
    for i in range(v.size):
        h = base.copy()
        h.update(v[i : i + 1].tobytes())
        if labels is not None:
            h.update(b"L" + int(labels[i]).to_bytes(8, "little", signed=True))
        if contents is not None:
            h.update(b"C" + contents[i])
        out.append(h.digest()[:16])
    return out


def content_digests(salt: bytes, contents: Sequence[bytes]) -> list[bytes]:
    """One digest per row of its content alone (a CSV row's fields, whichever column holds the value)."""
    base = hashlib.sha256(b"dpcdf/spool-content/v1" + salt)
    out = []
    for c in contents:
        h = base.copy()
        h.update(c)
        out.append(h.digest()[:16])
    return out


def _locked(method):
    """The method runs holding the spool's mutex."""
    @functools.wraps(method)
    def run(self, *args, **kwargs):
        with self.mutex:
            return method(self, *args, **kwargs)
    return run


class Spool:
    """The reports of one task from every input of this client. `Spool.open(path, fingerprint)`
    creates the file or checks that it is this task's; ":memory:" keeps it in memory (no crash
    safety). `admit` matches an input against it, `add` spools new reports, the rest serves the upload."""

    def __init__(self, db: sqlite3.Connection, path: str, lock: int | None = None):
        self.db, self.path, self._lock = db, path, lock
        self.mutex = threading.RLock()  # one thread in the connection at a time (the upload's threads share it)

    @classmethod
    def open(cls, path: str | Path, fingerprint: bytes) -> "Spool":
        path = str(path)
        lock = None if path == ":memory:" else _exclusive(os.path.realpath(path) + ".lock")  # one lock per file, links too
        try:
            if path != ":memory:":
                create_private(path)
            db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        except BaseException:
            if lock is not None:
                os.close(lock)
            raise
        spool = cls(db, path, lock)
        try:
            if path != ":memory:":
                db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=FULL")
            spool._check(fingerprint)
        except sqlite3.DatabaseError as exc:
            spool.close()
            raise SpoolMismatch(f"{path} is not a dpcdf spool ({exc}); choose another --spool") from None
        except BaseException:
            spool.close()
            raise
        return spool

    def _check(self, fingerprint: bytes) -> None:
        db, path = self.db, self.path
        tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        if "reports" in tables and "sources" not in tables:
            raise SpoolMismatch(f"spool {path} was written by an older dpcdf (one input per spool); finish its "
                                "upload with that version, or choose another --spool")
        db.executescript(SCHEMA)
        with self._transaction():
            meta = dict(db.execute("SELECT name, value FROM meta").fetchall())
            if not meta:
                self.salt = secrets.token_bytes(16)
                db.executemany("INSERT INTO meta VALUES (?, ?)", [("fingerprint", fingerprint), ("version", VERSION),
                                                                  ("salt", self.salt)])
            elif bytes(meta["fingerprint"]) != fingerprint:
                raise SpoolMismatch(f"spool {path} holds reports for another task; choose another --spool")
            else:
                self.salt = bytes(meta["salt"])

    @contextmanager
    def _transaction(self) -> Iterator[None]:
        self.db.execute("BEGIN IMMEDIATE")
        try:
            yield
            self.db.execute("COMMIT")
        except BaseException:  # Ctrl-C may land just after the COMMIT: then there is nothing to roll back
            if self.db.in_transaction:
                self.db.execute("ROLLBACK")
            raise

    def digests(self, values, labels=None, contents: Sequence[bytes] | None = None) -> list[bytes]:
        """The input rows' digests under this spool's salt (`row_digests`)."""
        return row_digests(self.salt, np.asarray(values, dtype=np.float64).reshape(-1),
                           None if labels is None else np.asarray(labels).reshape(-1), contents)

    def content_digests(self, contents: Sequence[bytes] | None) -> list[bytes] | None:
        """The rows' content digests under this spool's salt (`content_digests`), None without contents."""
        return None if contents is None else content_digests(self.salt, contents)

    @_locked
    def admit(self, digests: Sequence[bytes], source: str, lines: Sequence[int] | None = None,
              allow_duplicates: bool = False, contents: Sequence[bytes] | None = None) -> Admission:
        """Matches an input (its rows' digests, in order, and their line numbers in `source`; `contents`
        their content digests, if rows have content) against the spool; see the module's docstring.
        Raises `DuplicateRows` for rows spooled from another source, or with another value, unless
        `allow_duplicates`. Registers the source (or its new version)."""
        lines = list(range(1, len(digests) + 1)) if lines is None else list(lines)
        names = {sid: (name, version) for sid, name, version in self.db.execute("SELECT id, name, version FROM sources")}
        held: dict[bytes, list[tuple[int, int]]] = defaultdict(list)  # digest -> [(source id, line)] in row order
        for digest, sid, line in self.db.execute("SELECT digest, source, line FROM reports ORDER BY row"):
            held[bytes(digest)].append((sid, line))
        wanted: dict[bytes, int] = defaultdict(int)
        for d in digests:
            wanted[d] += 1
        # the version of this source whose rows this input still holds (all of them); else a new version
        versions = sorted(((v, sid) for sid, (n, v) in names.items() if n == source), reverse=True)
        chosen, new_version = None, False
        best = -1
        for _, sid in versions:  # the fullest version the input still holds whole (newest among equals)
            mine: dict[bytes, int] = defaultdict(int)
            for d, places in held.items():
                mine[d] += sum(1 for s, _ in places if s == sid)
            extends = all(wanted[d] >= k for d, k in mine.items())  # a re-run, or rows added
            within = all(mine[d] >= k for d, k in wanted.items())  # a part of what was spooled: nothing new
            if (extends or within) and sum(mine.values()) > best:
                chosen, best = sid, sum(mine.values())
        if chosen is None:
            new_version = bool(versions)
            version = versions[0][0] + 1 if versions else 1
            with self._transaction():
                chosen = self.db.execute("INSERT INTO sources (name, version) VALUES (?, ?)", (source, version)).lastrowid
            assert chosen is not None  # (the row the INSERT made)
            names[chosen] = (source, version)
        own = {d: deque(line for s, line in places if s == chosen) for d, places in held.items()}
        other = {d: deque((s, line) for s, line in places if s != chosen) for d, places in held.items()}
        new, spooled, duplicates = [], 0, []
        for i, d in enumerate(digests):
            if own.get(d):
                own[d].popleft()
                spooled += 1
            elif other.get(d):
                sid, line = other[d].popleft()
                name, version = names[sid]
                duplicates.append((lines[i], f"{shown(name)} as spooled before (it changed since)" if name == source
                                   else shown(name) if version == 1 else f"{shown(name)} (version {version})", line))
                new.append(i)
            else:
                new.append(i)
        if contents is not None and new:  # a row spooled before with another value: another column of it
            seen: dict[bytes, list] = defaultdict(list)  # content -> [(row digest, source, line)]
            for content, digest, sid, line in self.db.execute(
                    "SELECT c.content, r.digest, r.source, r.line FROM contents AS c JOIN reports AS r USING (row) ORDER BY row"):
                seen[bytes(content)].append((bytes(digest), sid, line))
            matched = {line for line, *_ in duplicates}
            for i in new:  # a report of the same row *and value* was judged above (a repeat, a re-run): not this rule
                hit = next((e for e in seen.get(contents[i], ()) if e[0] != digests[i]), None)
                if lines[i] not in matched and hit is not None:
                    seen[contents[i]].remove(hit)
                    duplicates.append((lines[i], shown(names[hit[1]][0]) + ANOTHER_COLUMN, hit[2]))
        if duplicates and not allow_duplicates:
            raise DuplicateRows(_duplicates_message(source, duplicates, len(digests)), duplicates)
        return Admission(source, chosen, len(digests), np.array(new, dtype=np.int64), spooled, duplicates, new_version)

    @_locked
    def spooled(self) -> int:
        """Reports made and committed, from every source."""
        return self.db.execute("SELECT COUNT(*) FROM reports").fetchone()[0]

    @_locked
    def add(self, admission: Admission, reports: list[tuple]) -> None:
        """Commits (report id, report bytes, row digest, line[, content digest]) for rows of the admitted
        source, in one transaction."""
        try:
            with self._transaction():  # rows numbered 0, 1, ... in the order they were made
                first = self.db.execute("SELECT COALESCE(MAX(row), -1) + 1 FROM reports").fetchone()[0]
                self.db.executemany("INSERT INTO reports VALUES (?, ?, ?, ?, ?, ?)",
                                    ((first + k, r[0], r[1], r[2], admission.source_id, int(r[3])) for k, r in enumerate(reports)))
                self.db.executemany("INSERT INTO contents VALUES (?, ?)",  # a table of its own: older dpcdf still reads the spool
                                    ((first + k, r[4]) for k, r in enumerate(reports) if len(r) > 4 and r[4] is not None))
        except sqlite3.IntegrityError:  # a report id twice: 2^-128 by chance; only a bug or another writer
            raise SpoolBusy(f"{self.path}: a report id was spooled twice (another process writing?)") from None

    @_locked
    def unacknowledged(self, party: int, limit: int, after: int = -1) -> list[tuple[int, bytes]]:
        """Up to `limit` (row, report) after row `after` that server `party` has neither acknowledged
        nor rejected (one primary-key probe per row, so a whole upload stays linear in its rows)."""
        return [(r, bytes(b)) for r, b in self.db.execute(
            "SELECT row, body FROM reports AS r WHERE row > ? AND NOT EXISTS "
            "(SELECT 1 FROM acks AS a WHERE a.row = r.row AND a.party = ?) ORDER BY row LIMIT ?", (after, party, limit))]

    @_locked
    def acknowledged(self, party: int) -> int:
        """How many reports server `party` has acknowledged."""
        return self.db.execute("SELECT COUNT(*) FROM acks WHERE party = ? AND rejected IS NULL", (party,)).fetchone()[0]

    @_locked
    def record(self, party: int, acked: list[int], rejected: dict[int, str]) -> None:
        """Server `party`'s answer for some rows: stored (new or duplicate), or refused for good."""
        with self._transaction():
            self.db.executemany("INSERT OR REPLACE INTO acks VALUES (?, ?, NULL)", ((r, party) for r in acked))
            self.db.executemany("INSERT OR REPLACE INTO acks VALUES (?, ?, ?)", ((r, party, e) for r, e in rejected.items()))

    @_locked
    def rejections(self) -> list[tuple[int, int, str]]:
        """(row, party, reason) of every refused report."""
        return self.db.execute("SELECT row, party, rejected FROM acks WHERE rejected IS NOT NULL ORDER BY row").fetchall()

    @_locked
    def status(self) -> SpoolStatus:
        q = self.db.execute
        spooled = self.spooled()
        complete = q("SELECT COUNT(*) FROM (SELECT row FROM acks WHERE rejected IS NULL GROUP BY row HAVING COUNT(*) = 2)").fetchone()[0]
        rejected = q("SELECT COUNT(DISTINCT row) FROM acks WHERE rejected IS NOT NULL").fetchone()[0]
        return SpoolStatus(spooled, spooled, complete, spooled - complete - rejected, rejected)

    @_locked
    def close(self) -> None:
        self.db.close()
        if self._lock is not None:
            os.close(self._lock)  # releases the flock
            self._lock = None


def ranges(lines: Sequence[int], limit: int = 4) -> str:
    """'2-5, 9, 12-13' for [2, 3, 4, 5, 9, 12, 13]; past `limit` runs, '... (N runs)'."""
    runs: list[list[int]] = []
    for x in lines:
        if runs and x == runs[-1][1] + 1:
            runs[-1][1] = x
        else:
            runs.append([x, x])
    text = ", ".join(f"{a}" if a == b else f"{a}-{b}" for a, b in runs[:limit])
    return text + (f", ... ({len(runs)} runs in all)" if len(runs) > limit else "")


def shown(name: str) -> str:
    """A source's name as the user would type it: a path relative to here when it is below here."""
    if name.startswith("/"):
        rel = os.path.relpath(name)
        return name if rel.startswith("..") else rel
    return name


def _duplicates_message(source: str, duplicates: list[tuple[int, str, int]], rows: int) -> str:
    by_source: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for line, other, there in duplicates:
        by_source[other].append((line, there))
    parts = [f"lines {ranges([a for a, _ in pairs])} equal lines {ranges([b for _, b in pairs])} of {other}"
             for other, pairs in by_source.items()]
    every = "all " if len(duplicates) == rows else ""
    if all(other.endswith(ANOTHER_COLUMN) for other in by_source):  # the same rows, another --column
        return (f"{every}{len(duplicates)} of the {rows} rows of {shown(source)} were spooled for this task before with "
                f"another value (--column or --label-column): {'; '.join(parts)}. A task counts each row once: "
                "sending them would count these people twice. Nothing was sent. To release another column, make a "
                "task for it; rows that only look alike (other people's) go with --allow-duplicates")
    return (f"{every}{len(duplicates)} of the {rows} rows of {shown(source)} are already in the spool for this task from another "
            f"input ({'; '.join(parts)}): sending them would count them twice. Nothing was sent. If these rows are "
            "other people's (equal values), run the same command with --allow-duplicates; if the input repeats "
            "one already sent, there is nothing to do")


def _exclusive(path: str) -> int:
    """An exclusive, non-blocking flock on `path` (held until its descriptor is closed)."""
    fd = exclusive_lock(path)
    if fd is None:
        raise SpoolBusy(f"spool {path[:-5]} is in use by another upload to this task; wait for it to end, or "
                        "give this one its own --spool")
    return fd
