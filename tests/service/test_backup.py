"""`dpcdf admin backup` in process (issue 24, `dpcdf.service.storage.backup`): a consistent copy of a
store that is being written, segment files checked against their recorded SHA-256 (a stale one left
out with its records, to be rebuilt), a manifest that catches a changed file, and the refusals."""
import hashlib
import os
import secrets
import sqlite3
import subprocess
import sys
import threading

import pytest

from dpcdf.service.storage import Mark, Store
from dpcdf.service.storage.backup import BackupError, backup, check
from dpcdf.service.storage.records import SegmentFile
from dpcdf.service.storage.segments import task_dir


def _segment(store, data, task_id, content: bytes, recorded: bytes | None = None):
    frozen = store.freeze(task_id, lambda ids: "h")
    store.mark(task_id, Mark.RECONCILED)
    directory = task_dir(data, task_id)
    directory.mkdir(parents=True)
    (directory / "00000.seeds.npy").write_bytes(content)
    digest = hashlib.sha256(recorded if recorded is not None else content).hexdigest()
    store.record_segments(task_id, [SegmentFile(0, "seeds", frozen.count, "00000.seeds.npy", digest, frozen.digest)])


def test_a_backup_of_a_store_being_written_is_consistent_and_checked(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    store = Store(data / "server.sqlite")
    (data / "hpke_x25519.pem").write_bytes(b"private key")
    (data / "admin.token").write_bytes(b"the operator's token")  # issue 46: never copied (commands the live server)
    for t in ("good", "stale", "busy"):
        store.add_task(t, "{}", b"f" * 32, secrets.token_bytes(32))
        store.add_many(t, [(secrets.token_bytes(16), secrets.token_bytes(64)) for _ in range(50)])
    _segment(store, data, "good", b"shares of good")
    _segment(store, data, "stale", b"rebuilt since", recorded=b"what was recorded")
    stop = threading.Event()

    def write():  # the server goes on: batches of 100 in one transaction each
        while not stop.is_set():
            store.add_many("busy", [(secrets.token_bytes(16), secrets.token_bytes(64)) for _ in range(100)])

    writer = threading.Thread(target=write)
    writer.start()
    try:
        out = backup(data, tmp_path / "backup")
    finally:
        stop.set()
        writer.join()
    assert out["tasks"] == 3 and out["segments_left_out"] == ["stale"]
    manifest = check(tmp_path / "backup")
    assert set(manifest["files"]) == {"server.sqlite", "hpke_x25519.pem", "segments/good/00000.seeds.npy"}
    assert not (tmp_path / "backup" / "admin.token").exists()
    copy = sqlite3.connect(tmp_path / "backup" / "server.sqlite")
    assert copy.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    busy = copy.execute("SELECT COUNT(*) FROM reports WHERE task_id = 'busy'").fetchone()[0]
    assert busy % 100 == 50  # whole transactions only
    assert copy.execute("SELECT COUNT(*) FROM segments WHERE task_id = 'stale'").fetchone()[0] == 0
    assert copy.execute("SELECT COUNT(*) FROM segments WHERE task_id = 'good'").fetchone()[0] == 1
    copy.close()
    assert (tmp_path / "backup").stat().st_mode & 0o077 == 0
    assert all(p.stat().st_mode & 0o077 == 0 for p in (tmp_path / "backup").rglob("*"))
    (tmp_path / "backup" / "hpke_x25519.pem").write_bytes(b"another key!")
    with pytest.raises(BackupError, match="differs from the backup's manifest"):
        check(tmp_path / "backup")
    with pytest.raises(BackupError, match="not an empty directory"):
        backup(data, tmp_path / "backup")
    with pytest.raises(BackupError, match="not a server's data directory"):
        backup(tmp_path / "nothing", tmp_path / "b2")
    with pytest.raises(BackupError, match="inside the data directory"):
        backup(data, data / "b3")


def test_the_cli_errors_are_one_line(tmp_path):
    run = subprocess.run([sys.executable, "-m", "dpcdf", "admin", "backup", "--data", str(tmp_path), "--to",
                          str(tmp_path / "b")], capture_output=True, text=True)
    assert run.returncode == 2 and run.stderr.count("\n") == 1 and run.stderr.startswith("dpcdf: ")
    run = subprocess.run([sys.executable, "-m", "dpcdf", "admin", "check-backup", str(tmp_path)], capture_output=True, text=True)
    assert run.returncode == 2 and "no readable MANIFEST.json" in run.stderr and run.stderr.count("\n") == 1
    run = subprocess.run([sys.executable, "-m", "dpcdf", "serve", "--party", "0", "--port", "1", "--data", str(tmp_path / "d"),
                          "--retention", "forever"], capture_output=True, text=True)
    assert run.returncode == 2 and "a retention must be a positive duration" in run.stderr and run.stderr.count("\n") == 1


@pytest.mark.parametrize("args,says", [
    (["admin"], "required: ACTION"),
    (["admin", "delete", "--server", "http://127.0.0.1:1"], "required: TASK_ID"),
    (["admin", "tasks", "--server", "http://127.0.0.1:1"], "operator token"),
    (["admin", "tasks", "--server", "http://127.0.0.1:1", "--token-file", "/nonexistent"], "cannot read the operator token"),
    (["serve", "--party", "0", "--port", "1", "--data", "/tmp/none", "--sweep-every", "0"], "--sweep-every must be a positive"),
])
def test_admin_mistakes_are_one_line(args, says):
    env = {k: v for k, v in os.environ.items() if k != "DPCDF_ADMIN_TOKEN"}
    run = subprocess.run([sys.executable, "-m", "dpcdf", *args], capture_output=True, text=True, env=env)
    assert run.returncode == 2 and run.stderr.startswith("dpcdf: ") and run.stderr.count("\n") == 1, run.stderr
    assert says in run.stderr, run.stderr


def test_the_backup_marks_which_tasks_were_finished_and_a_backup_of_a_restore_keeps_the_marks(tmp_path):
    """A task is finished in a backup once nothing but replays and DONE is left to exchange: a verified
    task once verified, an unverified one once reconciled, any task once answered or with DONE journalled;
    collecting, closed, and verified-but-unchecked tasks are not. The live store is not marked, and a
    backup of a restored store keeps the first backup's marks (a task refused stays refused)."""
    from dpcdf.service.storage.restore import states

    data = tmp_path / "data"
    data.mkdir()
    store = Store(data / "server.sqlite")
    verified, plain = '{"verify":true}', "{}"
    for name, config in (("collecting", plain), ("closed", plain), ("unchecked", verified), ("checked", verified),
                         ("reconciled", plain), ("answered", verified), ("done", verified)):
        store.add_task(name, config, b"f" * 32, secrets.token_bytes(32))
        store.add_many(name, [(secrets.token_bytes(16), secrets.token_bytes(64))])
        if name != "collecting":
            store.freeze(name, lambda ids: "h")
    for name, marks in (("unchecked", "r"), ("checked", "rv"), ("reconciled", "r"), ("answered", "ra")):
        for m in marks:
            store.mark(name, {"r": Mark.RECONCILED, "v": Mark.VERIFIED, "a": Mark.ANSWERED}[m])
    store.record_exchange("done", "helper", 13, 0, b"", b"")
    summary = backup(data, tmp_path / "b1")
    assert (summary["tasks"], summary["unfinished"]) == (7, 3)
    first = states(Store(tmp_path / "b1" / "server.sqlite"))
    assert first == {"collecting": "unfinished", "closed": "unfinished", "unchecked": "unfinished",
                     "checked": "finished", "reconciled": "finished", "answered": "finished", "done": "finished"}
    assert states(store) == {}
    restored = Store(tmp_path / "b1" / "server.sqlite")
    restored.mark("unchecked", Mark.VERIFIED)  # (as if it went on; on a restored server it cannot)
    restored.close()
    assert states(Store(tmp_path / "b1" / "server.sqlite")) == first
    backup(tmp_path / "b1", tmp_path / "b2")
    assert states(Store(tmp_path / "b2" / "server.sqlite")) == first
