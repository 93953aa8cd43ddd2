"""Retention of a server's key shares (issue 24): what is deleted, when, and how the deletion survives a
crash. The server's sweep (`dpcdf.service.server.housekeeping`) and the operator's delete call these.

When a task's key shares go:
- 'released': a verified task whose close is over on this server (its report check is done and server
  0's DONE was exchanged, or it answered a query). Its queries read only its histogram share (made at
  the close), its noise seed and the designs fixed by earlier queries, so its report rows (ids and key
  shares), round-one batches, segment files and the journal of the check's messages are deleted; the
  histogram share, noise seed, fixed designs, report set's count and hash, exclusion counts, query log
  and DONE step stay, for as long as the task is kept. An unverified task is never 'released': its key
  shares stay until it expires or is deleted (a grid above 2^16 points evaluates them at every query;
  a smaller one answers from its histogram share, `protocols.grid_sums`, and its batches are deleted
  with the key shares).
- 'expired': the task is older than the server's `--retention` and still holds key shares (never
  closed, unverified, or a close that never finished).
- 'deleted': the operator's delete (`DELETE /admin/tasks/{id}`).
An expired or deleted task keeps only its row (id, config, fingerprint, times, counted reports), so its
id is refused if registered again (409; reports clients still spool never count under a fresh seed); its noise seed is
overwritten with random bytes, its histogram, fixed designs, exclusions and query log deleted, and it
answers nothing again (the analyst gets 410; its collection is closed, so uploads get 409).

Durability: one SQLite transaction marks the task (purged_at, purge_reason) and deletes its small rows;
then its report rows go, CHUNK per transaction; then its segment files; then a TRUNCATE checkpoint (the
WAL's copies of the freed pages go too). Deletes run with `PRAGMA secure_delete` on (freed pages are
zeroed, not left holding the shares), and a purge that leaves a quarter of the store's pages free
VACUUMs it, so the file shrinks too (`vacuum_if_sparse`). A crash after the mark leaves rows or files of a task marked
purged: `recover` (at every start and sweep) deletes them. Every step is idempotent. What this cannot reach: copies in backups, and blocks the filesystem or disk keep after an
unlink or an overwrite (use an encrypted disk for that)."""
from __future__ import annotations

import json
import logging
import os
import re
import sqlite3
from pathlib import Path
from contextlib import contextmanager
from typing import Callable, Iterator, NamedTuple

from ...errors import DpcdfError
from .lifecycle import DONE_KIND, GONE, REASONS  # noqa: F401 (DONE_KIND, GONE: named here too)
from .segments import task_dir
from .store import Store

log = logging.getLogger("dpcdf.retention")

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


class Purged(NamedTuple):
    """One task's purge: its id, why, how many report rows and segment files were deleted now."""
    task_id: str
    reason: str
    reports: int
    files: int


def parse_duration(text: str) -> float:
    """'30d', '12h', '90m', '45s', '2w' or plain seconds -> seconds (DpcdfError otherwise)."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*", str(text))
    if not m or float(m.group(1)) <= 0:
        raise DpcdfError(f"a retention must be a positive duration such as 30d, 12h, 90m or 45s, got {text!r}")
    return float(m.group(1)) * _UNITS[m.group(2) or "s"]


def gone(store: Store, task_id: str) -> str | None:
    """'expired' or 'deleted' for a task that answers nothing again, else None (also for unknown ids)."""
    life = store.lifecycle(task_id)
    return None if life is None else life.gone


def purge_reason(store: Store, task_id: str) -> str | None:
    """Why the task's key shares were deleted ('released', 'expired', 'deleted'), or None."""
    life = store.lifecycle(task_id)
    return None if life is None else life.purge_reason


def released(store: Store) -> list[str]:
    """Verified tasks whose release is final on this server and whose key shares are still stored: the
    check is done and the exchange finished (DONE journalled, or a query answered): `Lifecycle.releasable`."""
    return [life.task_id for life in store.lifecycles() if life.releasable]


def expired(store: Store, before: float) -> list[str]:
    """Tasks registered before `before` (a time) that still hold key shares."""
    return [life.task_id for life in store.lifecycles() if life.purge_reason is None and life.created < before]


def purge(store: Store, task_id: str, reason: str, data_dir: str | Path,
          after_commit: Callable[[], None] = lambda: None) -> Purged:
    """Deletes the task's key shares (and, for 'expired' and 'deleted', all but its row): marks it
    and deletes its small rows in one transaction, then its report rows (`delete_rows`, CHUNK per
    transaction, so other requests wait for the store one chunk at a time), then its segment files
    (see the module). Idempotent: a purged task is marked again only to widen 'released' to a gone
    reason. Raises UnknownTask. `after_commit` runs right after the marking transaction (tests crash
    there)."""
    if reason not in REASONS:
        raise ValueError(f"unknown purge reason {reason!r}")
    with _secure(store):
        store.mark_purged(task_id, reason)
    after_commit()
    reports = delete_rows(store, task_id)
    files = remove_files(data_dir, task_id)
    with store.lock:
        store.db.execute("PRAGMA wal_checkpoint(TRUNCATE)")  # the WAL's copies of the freed pages go too
    if reports:
        vacuum_if_sparse(store)
    return Purged(task_id, reason, reports, files)


VACUUM_FREE = 0.25  # a purge that leaves at least this share of the store's pages free rewrites the store


def vacuum_if_sparse(store: Store) -> bool:
    """VACUUM the store when purges left `VACUUM_FREE` of its pages free (zeroed by secure_delete, but
    still the file's size): the file shrinks to what live tasks hold. It holds the store while it
    rewrites it (about the time a backup's copy takes); purges that free little never pay it. Then a
    TRUNCATE checkpoint, so the WAL does not keep the rewritten pages either. Returns whether it ran."""
    with store.lock:
        pages = store.db.execute("PRAGMA page_count").fetchone()[0]
        free = store.db.execute("PRAGMA freelist_count").fetchone()[0]
        if not pages or free < VACUUM_FREE * pages:
            return False
        try:
            store.db.execute("VACUUM")
        except sqlite3.OperationalError as exc:  # the purge is done either way: the pages stay zeroed, the file large
            log.warning("store not vacuumed after a purge: %s", exc)
            return False
        store.db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    return True


CHUNK = 5_000  # report rows deleted per transaction: each holds the store for well under a second (docs/service.md)


@contextmanager
def _secure(store: Store) -> Iterator[None]:
    """The store's connection with PRAGMA secure_delete on (deleted content is overwritten with zeros)."""
    with store.lock:
        secure = store.db.execute("PRAGMA secure_delete").fetchone()[0]
        store.db.execute("PRAGMA secure_delete = ON")
        try:
            yield
        finally:
            store.db.execute(f"PRAGMA secure_delete = {int(secure)}")


def delete_rows(store: Store, task_id: str) -> int:
    """Deletes a purged task's report rows, CHUNK per transaction, then its round-one batches; how
    many report rows it deleted."""
    total = 0
    while True:
        with _secure(store), store._transaction() as db:
            n = db.execute("DELETE FROM reports WHERE seq IN (SELECT seq FROM reports WHERE task_id = ? LIMIT ?)",
                           (task_id, CHUNK)).rowcount
            if n < CHUNK:
                db.execute("DELETE FROM check_batches WHERE task_id = ?", (task_id,))
        total += n
        if n < CHUNK:
            return total


def remove_files(data_dir: str | Path, task_id: str) -> int:
    """Removes the task's segment directory (files, then the directory, then an fsync of the parent);
    how many files it removed (0 if there was none)."""
    directory = task_dir(data_dir, task_id)
    if not directory.is_dir():
        return 0
    removed = 0
    for f in directory.iterdir():
        f.unlink()
        removed += 1
    directory.rmdir()
    fd = os.open(directory.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    return removed


def recover(store: Store, data_dir: str | Path) -> int:
    """Finishes purges a crash interrupted: the report rows and segment files of tasks marked purged
    (and round-one batches a background check stored after a purge). Returns how many rows and
    files it deleted."""
    purged = [life.task_id for life in store.lifecycles() if life.purge_reason is not None]
    return sum(delete_rows(store, t) + remove_files(data_dir, t) for t in purged)


def tasks(store: Store, counts: bool = True) -> list[dict]:
    """Every task's id, state (its `Phase`), times, restore mark, and (with `counts`) its stored report rows,
    counted reports, excluded reports, segment files, whether it holds a histogram share, and queries answered."""
    with store.lock:
        lives = store.lifecycles()
        rows = {r[0]: (json.loads(r[1]), r[2]) for r in store.db.execute("SELECT task_id, config, report_count FROM tasks")}
        per = {}
        if counts:
            for table, name in (("reports", "stored"), ("excluded", "excluded"), ("segments", "segment_files"),
                                ("histograms", "histogram"), ("queries", "queries")):
                per[name] = dict(store.db.execute(f"SELECT task_id, COUNT(*) FROM {table} GROUP BY task_id").fetchall())
    out = []
    for life in lives:
        config, counted = rows[life.task_id]
        item = {**life.times(), "verified_task": bool(config.get("verify", False)), "counted": counted,
                "name": config.get("name"), "restored": life.restored}
        for name, values in per.items():
            item[name] = values.get(life.task_id, 0)
        if counts:
            item["histogram"] = bool(item["histogram"])
        out.append(item)
    return out
