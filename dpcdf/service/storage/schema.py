"""The store's SQLite tables (STRICT) and how an existing file is brought up to them: numbered
migrations (as janus's numbered SQL files), the file's `PRAGMA user_version` saying how many it has had.

Stores written before the numbering are at version 1 and may already hold some later tables or
columns (they were added at every open without a version change): every migration is idempotent
(CREATE ... IF NOT EXISTS, a column added only when missing), so `migrate` brings any such file to
the latest version and a re-run changes nothing."""
from __future__ import annotations

import sqlite3
from pathlib import Path

from .records import StoreError

SCHEMA_VERSION = 1  # the first numbered version: SCHEMA below (`migrate` goes on to LATEST)

# STRICT tables: SQLite refuses a value of the wrong type instead of storing it as given. A task's
# closed set is all four of frozen_seq, report_count, set_hash, closed_at or none of them, and it
# is reconciled or answered only once closed.
SCHEMA = """
CREATE TABLE IF NOT EXISTS tasks (
    task_id TEXT PRIMARY KEY, config TEXT NOT NULL, fingerprint BLOB NOT NULL, noise_seed BLOB NOT NULL,
    created REAL NOT NULL,
    frozen_seq INTEGER, report_count INTEGER, set_hash TEXT, closed_at REAL,
    reconciled_at REAL, answered_at REAL,
    CHECK ((frozen_seq IS NULL) = (closed_at IS NULL) AND (report_count IS NULL) = (closed_at IS NULL)
           AND (set_hash IS NULL) = (closed_at IS NULL)),
    CHECK (frozen_seq IS NULL OR (frozen_seq >= 0 AND report_count >= 0)),
    CHECK (reconciled_at IS NULL OR closed_at IS NOT NULL),
    CHECK (answered_at IS NULL OR closed_at IS NOT NULL)
) STRICT;
CREATE TABLE IF NOT EXISTS reports (
    seq INTEGER PRIMARY KEY AUTOINCREMENT, task_id TEXT NOT NULL REFERENCES tasks (task_id),
    report_id BLOB NOT NULL, key_share BLOB NOT NULL, received REAL NOT NULL,
    UNIQUE (task_id, report_id)
) STRICT;
CREATE TABLE IF NOT EXISTS excluded (
    task_id TEXT NOT NULL REFERENCES tasks (task_id), report_id BLOB NOT NULL,
    PRIMARY KEY (task_id, report_id)
) STRICT;
CREATE TABLE IF NOT EXISTS releases (
    task_id TEXT NOT NULL REFERENCES tasks (task_id), kind TEXT NOT NULL, params TEXT NOT NULL,
    fixed_at REAL NOT NULL,
    PRIMARY KEY (task_id, kind)
) STRICT;
CREATE TABLE IF NOT EXISTS queries (
    task_id TEXT NOT NULL REFERENCES tasks (task_id), at REAL NOT NULL, kind TEXT NOT NULL,
    points INTEGER NOT NULL
) STRICT;
"""

# Version 2: where a reconciled
# task's key shares are kept for evaluation, one row per array file of each shard, with the file's
# SHA-256 and the hash of the report set it was written from (`dpcdf.service.storage.segments`).
SEGMENTS_SCHEMA = """
CREATE TABLE IF NOT EXISTS segments (
    task_id TEXT NOT NULL REFERENCES tasks (task_id), shard INTEGER NOT NULL, array TEXT NOT NULL,
    n INTEGER NOT NULL, file TEXT NOT NULL, sha256 TEXT NOT NULL, set_hash TEXT NOT NULL, written REAL NOT NULL,
    PRIMARY KEY (task_id, shard, array),
    CHECK (shard >= 0 AND n >= 0 AND length(sha256) = 64)
) STRICT
"""


# Versions 3 and 4: verified tasks (issue 12).
# tasks.verified_at: the close's report check is done; excluded.reason: NULL for a report dropped
# by the reconciliation, else the check's reason class; histograms: the server's share of a
# verified task's histogram (cumulative counts at every grid point), for the set it names (since issue
# 44 also an unverified task's on a grid of up to 2^16 points).
VERIFIED_SCHEMA = (
    ("tasks", "verified_at", "ALTER TABLE tasks ADD COLUMN verified_at REAL"),
    ("excluded", "reason", "ALTER TABLE excluded ADD COLUMN reason TEXT"),
)
HISTOGRAM_SCHEMA = """
CREATE TABLE IF NOT EXISTS histograms (
    task_id TEXT PRIMARY KEY REFERENCES tasks (task_id), set_hash TEXT NOT NULL, shape TEXT NOT NULL,
    data BLOB NOT NULL, written REAL NOT NULL
) STRICT
"""


# Version 5: the report check's round one of
# a verified task, computed while its reports arrive (`dpcdf.service.protocols.check.round_one`), one row per batch of
# consecutive reports (seq first_seq .. last_seq): their ids, round-one messages, states and check
# randomness as little-endian field elements, and the sum of their grid values. An unverified task's
# batches (issue 44, `dpcdf.service.protocols.grid_sums`) use the same rows: ids and sums (mod 2^64), the
# three per-report columns empty.
CHECK_SCHEMA = """
CREATE TABLE IF NOT EXISTS check_batches (
    task_id TEXT NOT NULL REFERENCES tasks (task_id), first_seq INTEGER NOT NULL, last_seq INTEGER NOT NULL,
    n INTEGER NOT NULL, ids BLOB NOT NULL, message BLOB NOT NULL, state BLOB NOT NULL, extras BLOB NOT NULL,
    sums BLOB NOT NULL,
    PRIMARY KEY (task_id, first_seq),
    CHECK (first_seq <= last_seq AND n > 0)
) STRICT
"""


# Version 6: the server-to-server exchanges'
# journal (`dpcdf.service.protocols.channel`). One row per step a server took part in: role 'helper'
# (it answered: the request it took and the answer it gave) or 'leader' (it asked: what it sent and the
# answer it accepted). A step is answered once: a retry replays the row, other content is refused.
EXCHANGES_SCHEMA = """
CREATE TABLE IF NOT EXISTS exchanges (
    task_id TEXT NOT NULL REFERENCES tasks (task_id), role TEXT NOT NULL, kind INTEGER NOT NULL,
    chunk INTEGER NOT NULL, request BLOB NOT NULL, answer BLOB NOT NULL, at REAL NOT NULL,
    PRIMARY KEY (task_id, role, kind, chunk),
    CHECK (role IN ('leader', 'helper') AND chunk >= 0)
) STRICT
"""


# Version 7: the rule for which reports count, written once. A report counts when it is stored for its
# task and not excluded, whether by the reconciliation (reason NULL) or by the report check.
COUNTED_VIEW = """
CREATE VIEW IF NOT EXISTS counted AS
SELECT seq, task_id, report_id, key_share, received FROM reports
WHERE NOT EXISTS (SELECT 1 FROM excluded WHERE excluded.task_id = reports.task_id AND excluded.report_id = reports.report_id)
"""


# Version 8: retention (issue 24, `dpcdf.service.storage.retention`). tasks.purged_at: when the task's key
# shares (report rows, round-one batches, segments) were deleted; purge_reason: 'released' (a verified
# task whose close is over: its histogram share, noise seed and fixed designs stay), 'expired' (the
# operator's --retention) or 'deleted' (the operator's delete): those two keep only the task's row.
RETENTION_SCHEMA = (
    ("tasks", "purged_at", "ALTER TABLE tasks ADD COLUMN purged_at REAL"),
    ("tasks", "purge_reason", "ALTER TABLE tasks ADD COLUMN purge_reason TEXT "
                              "CHECK (purge_reason IN ('released', 'expired', 'deleted'))"),
)


# Version 9: the restore marker (security review of issue 24, `dpcdf.service.storage.restore`), written by
# `dpcdf admin backup` into the copy only: one row per task the backup holds, and whether the task's
# exchange between the servers was over then. A live store's table stays empty.
RESTORED_SCHEMA = """
CREATE TABLE IF NOT EXISTS restored (
    task_id TEXT PRIMARY KEY REFERENCES tasks (task_id), finished INTEGER NOT NULL, backup TEXT NOT NULL,
    CHECK (finished IN (0, 1))
) STRICT
"""


def _add_columns(*columns: tuple[str, str, str]):
    def step(db: sqlite3.Connection) -> None:
        for table, column, statement in columns:
            if column not in {r[1] for r in db.execute(f"PRAGMA table_info({table})")}:
                db.execute(statement)
    return step


REPORTS_BY_TASK = "CREATE INDEX IF NOT EXISTS reports_by_task ON reports (task_id, seq)"
"""A task's reports after a seq, read or counted in O(those reports) (review of issue 44): by the seq
range alone, each upload's wake of a task that has not filled a batch scanned every later report of
every task (45 ms at 3 x 10^5, under the store's lock); by the (task_id, report_id) index, every
report of the task."""


def _create(*statements: str):
    def step(db: sqlite3.Connection) -> None:
        for statement in statements:
            db.execute(statement)
    return step


# MIGRATIONS[i] takes a store from version i + 1 to i + 2 (version 1 is SCHEMA).
MIGRATIONS = (
    _create(SEGMENTS_SCHEMA),  # 2: segments
    _add_columns(*VERIFIED_SCHEMA),  # 3: verified tasks' columns
    _create(HISTOGRAM_SCHEMA),  # 4: histogram shares
    _create(CHECK_SCHEMA),  # 5: round one of the report check
    _create(EXCHANGES_SCHEMA),  # 6: the server-to-server journal
    _create(COUNTED_VIEW),  # 7: the reports that count
    _add_columns(*RETENTION_SCHEMA),  # 8: retention
    _create(RESTORED_SCHEMA),  # 9: the restore marker
    _create(REPORTS_BY_TASK),  # 10: a task's reports in seq order (the batches' reads)
)
LATEST = SCHEMA_VERSION + len(MIGRATIONS)


def migrate(db: sqlite3.Connection, path: Path) -> None:
    """Inside the caller's transaction: creates a new store's tables, or checks an existing store's
    schema version (StoreError for a file of another version), then adds what is missing."""
    version = db.execute("PRAGMA user_version").fetchone()[0]
    if version == 0:
        if db.execute("SELECT 1 FROM sqlite_master WHERE name = 'tasks'").fetchone():
            raise StoreError(f"{path} was written by an older version of dpcdf (no schema version)")
        for statement in SCHEMA.split(";"):
            if statement.strip():
                db.execute(statement)
    elif version > LATEST:
        raise StoreError(f"{path} has store schema version {version}, from a newer dpcdf; this one reads up to {LATEST}")
    for number, step in enumerate(MIGRATIONS, start=SCHEMA_VERSION + 1):
        if max(version, SCHEMA_VERSION) < number:
            step(db)
    db.execute(f"PRAGMA user_version = {LATEST}")
