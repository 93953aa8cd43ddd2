"""A consistent copy of a server's data directory while the server runs (`dpcdf admin backup`), and its
check.

The store is copied with SQLite's online backup API (`sqlite3.Connection.backup`, in one step: one read
transaction, so the copy is the store as one committed moment left it, while the server goes on
writing under WAL). Segment files are copied after it, each checked against the SHA-256 the copied
store records for it; a file that no longer matches (rebuilt, or removed by a purge since that moment)
is left out together with its task's segment records, and the restored server rebuilds the segments
from the copied rows, as it does for any missing segment. The other files at the top of the data
directory (the HPKE private keys) are copied as they are, except the operator token (DATA/admin.token,
`ADMIN_TOKEN`): whoever holds a backup must not thereby command the live server (register, close,
delete tasks); a server restored from it makes a new token at its first start, or takes
--admin-token-file. MANIFEST.json, written last, lists every file with its size and SHA-256: a backup
without it is incomplete.

A backup holds everything the server does: key shares, HPKE private keys, noise seeds. It is made 0700
/ 0600 like the data directory; keep it as you keep the server. Retention does not reach it: restoring it
brings back the key shares of tasks purged since, and the restored server's first sweep deletes those of
tasks that are released or past its --retention again.

The copy is marked as a backup (`restore.mark_copy`, in the snapshot's store): a server restored from it
refuses every server-to-server step of a task unfinished at the snapshot, and any release design the
snapshot does not hold (`restore`: what a restore guarantees and what it refuses). Its manifest is
format 2 (FORMAT); one of format 1 was written by a release before the marks: `check` flags it, and a
server's first start on it, unchanged, marks it (`mark_unmarked`)."""
from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import sqlite3
import time
from pathlib import Path

from ...errors import DpcdfError
from ..files import create_private, fsync_dir, private_dir
from .restore import mark_copy
from .schema import migrate
from .segments import sha256, task_dir

STORE = "server.sqlite"
MANIFEST = "MANIFEST.json"
FORMAT = 2  # 2: the copy's store holds the restore marks (`restore.mark_copy`); 1: made before them
# not copied as files: the store (copied above), and the manifest of the backup a restored server was
# served from (its own is written last; copied, it listed itself, stale, and check refused the backup)
ADMIN_TOKEN = "admin.token"  # the operator's token a server makes in its data directory (`server.state`): never copied
SKIP = {STORE, STORE + "-wal", STORE + "-shm", STORE + "-journal", MANIFEST, ADMIN_TOKEN}


class BackupError(DpcdfError):
    """A backup cannot be made, or a backup does not match its manifest."""


def _copy(src: Path, dst: Path) -> str:
    """Copies `src` to `dst` (0600, fsynced); the copy's SHA-256."""
    h = hashlib.sha256()
    private_dir(dst.parent)
    with open(src, "rb") as fin, os.fdopen(os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "wb") as fout:
        while chunk := fin.read(1 << 20):
            h.update(chunk)
            fout.write(chunk)
        fout.flush()
        os.fsync(fout.fileno())
    return h.hexdigest()


_sha256 = sha256  # (segments'; hashlib.file_digest is Python 3.11's)


def backup(data_dir: str | Path, dest: str | Path) -> dict:
    """Backs `data_dir` up into `dest` (a new or empty directory); returns a summary: files, bytes,
    tasks, how many of them were unfinished (a server restored from it refuses their steps), and the tasks
    whose segments were left out (to be rebuilt on restore)."""
    data, dest = Path(data_dir), Path(dest)
    if not (data / STORE).is_file():
        raise BackupError(f"{data} is not a server's data directory (no {STORE})")
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
        raise BackupError(f"{dest} exists and is not an empty directory: back up into a new one")
    if dest.resolve() == data.resolve() or data.resolve() in dest.resolve().parents:
        raise BackupError(f"{dest} is inside the data directory {data}")
    private_dir(dest)
    created = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    create_private(dest / STORE)
    src = sqlite3.connect(str(data / STORE), timeout=30)
    dst = sqlite3.connect(str(dest / STORE), isolation_level=None)
    try:
        src.backup(dst)  # pages=-1: one step, one consistent snapshot
        dst.execute("BEGIN IMMEDIATE")
        migrate(dst, dest / STORE)
        unfinished = mark_copy(dst, created)[1]  # the copy only: the snapshot's promises, not the live store's
        dst.execute("COMMIT")
        recorded = dst.execute("SELECT task_id, file, sha256 FROM segments ORDER BY task_id, file").fetchall() \
            if dst.execute("SELECT 1 FROM sqlite_master WHERE name = 'segments'").fetchone() else []
        left_out = set()
        private_dir(dest / "segments")
        for task_id, file, digest in recorded:
            if task_id in left_out:
                continue
            source, target = task_dir(data, task_id) / file, task_dir(dest, task_id) / file
            try:
                ok = _copy(source, target) == digest
            except FileNotFoundError:
                ok = False
            if not ok:
                left_out.add(task_id)
                shutil.rmtree(task_dir(dest, task_id), ignore_errors=True)
        for task_id in sorted(left_out):
            dst.execute("DELETE FROM segments WHERE task_id = ?", (task_id,))
        tasks = dst.execute("SELECT COUNT(*) FROM tasks").fetchone()[0]
        dst.execute("PRAGMA journal_mode = WAL")
        dst.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        src.close()
        dst.close()
    for f in sorted(data.iterdir()):
        if f.is_file() and f.name not in SKIP and not f.name.endswith(".tmp"):
            _copy(f, dest / f.name)
    for extra in (STORE + "-wal", STORE + "-shm"):
        (dest / extra).unlink(missing_ok=True)
    files = {str(p.relative_to(dest)): {"sha256": _sha256(p), "bytes": p.stat().st_size}
             for p in sorted(dest.rglob("*")) if p.is_file()}
    manifest = {"format": FORMAT, "created": created, "source": str(data.resolve()),
                "files": files}
    tmp = dest / (MANIFEST + ".tmp")
    with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as out:
        json.dump(manifest, out, indent=1, sort_keys=True)
        out.flush()
        os.fsync(out.fileno())
    os.replace(tmp, dest / MANIFEST)
    fsync_dir(dest)
    return {"files": len(files), "bytes": sum(v["bytes"] for v in files.values()), "tasks": tasks,
            "unfinished": unfinished, "segments_left_out": sorted(left_out)}


def check(dest: str | Path) -> dict:
    """Checks a backup against its MANIFEST.json (every file there, of its size and SHA-256, and no
    file the manifest does not list); BackupError on the first difference. Returns the manifest, with
    `marked`: False for a backup made before the restore marks (format 1; see `mark_unmarked`)."""
    dest = Path(dest)
    try:
        manifest = json.loads((dest / MANIFEST).read_text())
    except (OSError, ValueError) as exc:
        raise BackupError(f"{dest} has no readable {MANIFEST} (an incomplete backup?): {exc}") from None
    for name, meta in manifest["files"].items():
        path = dest / name
        if not path.is_file() or path.stat().st_size != meta["bytes"] or _sha256(path) != meta["sha256"]:
            raise BackupError(f"{path} is missing or differs from the backup's manifest")
    listed = set(manifest["files"]) | {MANIFEST}
    extra = sorted(str(p.relative_to(dest)) for p in dest.rglob("*") if p.is_file() and str(p.relative_to(dest)) not in listed)
    if extra:
        raise BackupError(f"{dest} holds files its manifest does not list: {', '.join(extra[:3])}")
    return {**manifest, "marked": manifest.get("format", 1) >= FORMAT}


def mark_unmarked(data_dir: str | Path) -> int | None:
    """At a server's start, before its Store opens: marks `data_dir` if it is a backup made before the
    restore marks (a format 1 MANIFEST.json) whose store is still the snapshot (its SHA-256 is the
    manifest's, and no write-ahead log holds anything on top); returns how many of its tasks are
    unfinished, or None if there was nothing to mark.

    Marking here rather than refusing to start is as safe as the marks `backup` writes: `mark_copy` reads
    nothing but the store it marks, and a store byte for byte the one the manifest lists is the snapshot,
    so its marks are those the backup would have written; the migration and the marks are one
    transaction, so no crash leaves the store changed (no longer the snapshot) but unmarked. A refusal
    would only add a step for the operator, who could get it wrong by serving the backup with an older
    release. A store that differs from its manifest has been served since (by a release before the
    marks: its rollback is past mending) and is left as it is."""
    data = Path(data_dir)
    store, wal = data / STORE, data / (STORE + "-wal")
    try:
        manifest = json.loads((data / MANIFEST).read_text())
        listed = manifest["files"][STORE]["sha256"]
        if manifest.get("format", 1) >= FORMAT or (wal.exists() and wal.stat().st_size) or _sha256(store) != listed:
            return None
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None  # no manifest (a live data directory), or not one `backup` wrote
    db = sqlite3.connect(str(store), isolation_level=None)
    try:
        db.execute("BEGIN IMMEDIATE")
        migrate(db, store)
        unfinished = mark_copy(db, str(manifest.get("created", "a backup before restore marks")))[1]
        db.execute("COMMIT")
    finally:
        db.close()
    logging.getLogger("dpcdf.restore").warning(
        "%s is a backup made before restore marks: marked now, at its first start (%d unfinished tasks: refused, "
        "run them again as new tasks)", data, unfinished)
    return unfinished
