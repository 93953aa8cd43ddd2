"""Security review of issue 24's retention (purges) against the servers' once-only rule, in process.

Two servers (party 0 and 1) share a verified task whose report check ran to its end; then:
- passing tests pin what holds: after a 'released' purge server 1 (finished: DONE or a query) answers
  no check or reconciliation message again, replays included, although the purge deleted the journal
  of the check's messages; a deleted task's id is not registered again with a fresh seed; a backup is
  0700 / 0600 even into an existing 0755 directory.
- the review's findings, each with its attack test:
  1. (fixed) a report-check message to a *released* task was answered 409 before it was opened, so
     anyone could tell a released verified task from an unknown id (an unknown or gone task: 400);
     now 400 FORGED, as unknown (`peers._peer_task`);
  2. (fixed) a check message that passed `peers._peer_task` before an 'expired'/'deleted' purge and
     waited on the task's `answering` lock while the purge ran was answered afterwards from the
     in-memory round one, as a new step (the purge deleted the journal); now refused under the lock
     (`TaskState._not_purged`);
  3. (fixed) a backup restored on server 1 rolled back the journal: a step answered since was answered
     again, for other content; now `dpcdf admin backup` marks the copy and a restored server refuses every
     step of a task unfinished in it, in both roles, and any design the backup does not hold
     (`storage.restore`, 409 saying the task must be run again).
In 2 and 3 the check's MAC still keeps values hidden (the shifted opening gets no V_1): the journal is
the second line of defence that docs/verification.md says holds.
"""
from __future__ import annotations

import threading
import time
import warnings

import pytest

from dpcdf.service.client import make_reports
from dpcdf.service.protocols.channel import CHECK, Kind
from dpcdf.service.server import create_app
from dpcdf.service.storage import retention
from dpcdf.service.task import TaskConfig, token_hash
from dpcdf.service.wire import encode_batch
from helpers import GRID, OPERATOR, peer_post, values

with warnings.catch_warnings():
    warnings.filterwarnings("ignore", message=".*httpx2")
    from fastapi.testclient import TestClient

TOKEN = "the analyst's token for the retention review"
JSON = {"content-type": "application/json"}
AUTH = {"authorization": f"Bearer {OPERATOR}"}
P61 = (1 << 61) - 1


@pytest.fixture
def world(tmp_path):
    return _world(tmp_path)


def _world(tmp_path, before_check=lambda apps: None):
    """Two in-process servers with one verified task, closed, reconciled and checked on both (messages
    passed directly, as tests/service/fuzzing.py does). Returns (apps, clients, config, journal): the
    journal holds server 0's check messages as it sent them."""
    apps = tuple(create_app(party, tmp_path / f"server{party}", warm_up=False, sweep_every=1e9) for party in (0, 1))
    clients = [TestClient(app) for app in apps]
    keys = tuple(c.get("/hpke").json()["keys"]["x25519"] for c in clients)
    config = TaskConfig(GRID, 1.0, "tree", "substitution", 0, ("a", "b"), keys, token_hash(TOKEN), task_id="review-task")
    assert config.verify
    body = encode_batch([r.to_bytes() for r in make_reports(config, values(12, 7))])
    for party, client in enumerate(clients):
        assert client.post("/tasks", content=config.to_json(), headers=JSON | AUTH).status_code == 201
        assert client.post(f"/tasks/{config.task_id}/reports/batch", content=body).json()["accepted"] == 12
        srv = apps[party].state.server
        srv.store.freeze(config.task_id, srv.task(config.task_id).set_hash)
        srv.store.mark(config.task_id, "reconciled")
    before_check(apps)
    states = [app.state.server.task(config.task_id) for app in apps]
    helper = states[1].helper()
    sent = []

    def send(m: bytes) -> bytes:
        sent.append(m)
        return helper.answer(states[1].channel.open(m, CHECK, helper.context))

    states[0].check_leader().run(send)
    for app in apps:
        assert app.state.server.store.marked(config.task_id, "verified")
    return apps, clients, config, sent


def _shifted_open(apps, config) -> bytes:
    """Server 0's message 5 of chunk 0 with its last opened element shifted by 1 (the deviating server's
    second question about the same reports), sealed as server 0 seals it."""
    st0, st1 = (app.state.server.task(config.task_id) for app in apps)
    payload = bytearray(st1.channel.request(Kind.CHECK_OPEN, 0))
    last = int.from_bytes(payload[-8:], "little")
    payload[-8:] = ((last + 1) % P61).to_bytes(8, "little")
    return st0.channel.seal(Kind.CHECK_OPEN, 0, bytes(payload), st1.helper().context)


def test_a_released_task_answers_no_check_or_reconciliation_message_again(world):
    apps, clients, config, sent = world
    tid, store1 = config.task_id, apps[1].state.server.store
    shifted = _shifted_open(apps, config)
    store1.mark(tid, "answered")  # the analyst's first query on server 1: its release is final there
    swept = clients[1].post("/admin/retention", headers=AUTH).json()["purged"]
    assert [(p["task_id"], p["reason"]) for p in swept] == [(tid, "released")]
    assert store1.exchange(tid, "helper", Kind.CHECK_OPEN, 0) is None  # the journal of the check is gone ...
    st0 = apps[0].state.server.task(tid)
    for m in [*sent, shifted]:  # ... and still no step is answered again: replays and new content alike
        assert peer_post(clients[1], st0.channel, f"/tasks/{tid}/verify", m).status_code in (400, 409)
    digests = st0.channel.seal(Kind.DIGESTS, 0, b"\0" * 64)
    assert peer_post(clients[1], st0.channel, f"/tasks/{tid}/sync", digests).status_code in (400, 409)


def test_a_deleted_task_is_not_registered_again_with_a_fresh_seed(world):
    apps, clients, config, _ = world
    tid, store1 = config.task_id, apps[1].state.server.store
    assert clients[1].delete(f"/admin/tasks/{tid}", headers=AUTH).status_code == 200
    seed = store1.task(tid)[1]
    assert clients[1].post("/tasks", content=config.to_json(), headers=JSON | AUTH).status_code == 409
    assert store1.task(tid)[1] == seed
    channel = apps[0].state.server.task(tid).channel
    assert peer_post(clients[1], channel, f"/tasks/{tid}/verify", b"x" * 64).status_code == 400  # as unknown
    assert clients[1].post(f"/tasks/{tid}/verify", content=b"x" * 64).status_code == 401  # no request tag


def test_an_unauthenticated_caller_cannot_tell_a_released_task_from_an_unknown_one(world):
    apps, clients, config, _ = world
    tid = config.task_id
    apps[1].state.server.store.mark(tid, "answered")
    assert clients[1].post("/admin/retention", headers=AUTH).json()["purged"][0]["reason"] == "released"
    junk = b"\x05" + b"\0" * 63
    known = clients[1].post(f"/tasks/{tid}/verify", content=junk)
    unknown = clients[1].post(f"/tasks/{'0' * 32}/verify", content=junk)
    assert (known.status_code, known.json()) == (unknown.status_code, unknown.json())


def test_a_check_step_is_not_answered_again_across_a_purge(world):
    apps, clients, config, _ = world
    tid = config.task_id
    srv1 = apps[1].state.server
    st1 = srv1.task(tid)
    shifted, context = _shifted_open(apps, config), st1.helper().context
    channel = apps[0].state.server.task(tid).channel
    assert peer_post(clients[1], channel, f"/tasks/{tid}/verify", shifted).status_code == 409  # answered once: refused
    out = {}

    def attack() -> None:  # server 0's message, sent while the task is still known (before the purge)
        out["answer"] = peer_post(clients[1], channel, f"/tasks/{tid}/verify", shifted)

    # The expiry sweep (or the operator's delete) of a task whose DONE server 0 withheld: what
    # Retention._purge does under st.answering (policy.purge, forget_keys, the state dropped), with the
    # message above waiting on the same lock. The lock is taken here so that the message is in flight.
    with st1.answering:
        thread = threading.Thread(target=attack)
        thread.start()
        time.sleep(1.0)  # the message passed _peer_task and waits for `answering`
        retention.purge(srv1.store, tid, "expired", srv1.store.path.parent)
        st1.forget_keys()
        srv1.unload(tid)
    thread.join(30)
    answer = out["answer"]
    if answer.status_code == 200:  # show what came back: server 1's answer to step 5 for the shifted message
        st0 = apps[0].state.server.task(tid)
        opened = st0.channel.open(answer.content, (Kind.CHECK_ANSWER,), context)
        assert opened.chunk == 0
    assert answer.status_code in (400, 409), "step 5 of chunk 0 was answered a second time, for other content"


def test_a_restored_backup_does_not_answer_a_check_step_again(tmp_path):
    from dpcdf.service.storage.backup import backup

    copy = tmp_path / "backup1"

    def take(apps):  # server 1's operator backs up after the reconciliation, before the report check
        backup(apps[1].state.server.store.path.parent, copy)

    apps, clients, config, _ = _world(tmp_path, take)
    tid = config.task_id
    shifted, channel = _shifted_open(apps, config), apps[0].state.server.task(tid).channel
    assert peer_post(clients[1], channel, f"/tasks/{tid}/verify", shifted).status_code == 409  # answered once
    restored = TestClient(create_app(1, copy, warm_up=False, sweep_every=1e9))
    deadline = time.monotonic() + 60
    while True:  # its round one runs again in the background (503 until it is done)
        answer = peer_post(restored, channel, f"/tasks/{tid}/verify", shifted)
        if answer.status_code != 503 or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert answer.status_code in (400, 409), "the restored server 1 answered step 5 of chunk 0 again, for other content"


RESTORED = ("restored from a backup", "Discard the task on both servers", "run it again")


def test_a_restored_server_takes_no_step_of_an_unfinished_task_in_either_role_and_says_why(tmp_path):
    """Both operators back up after the reconciliation, before the check. Restored server 1 refuses even
    server 0's honest first check message, as sent (409, saying what to do), and DONE; restored server 0
    refuses the analyst's close before it freezes or sends anything (the task's servers "a" and "b" are
    not reachable: a message sent would be a 502), and its channel asks nothing (a deviating server 1
    would otherwise answer a step again and get V_0 computed on two inputs)."""
    from dpcdf.service.storage.backup import backup
    from dpcdf.service.storage.restore import Restored

    summaries = []

    def take(apps):
        summaries.extend(backup(apps[p].state.server.store.path.parent, tmp_path / f"copy{p}") for p in (0, 1))

    apps, _, config, sent = _world(tmp_path, take)
    tid = config.task_id
    assert [s["unfinished"] for s in summaries] == [1, 1]
    restored = [create_app(p, tmp_path / f"copy{p}", warm_up=False, sweep_every=1e9) for p in (0, 1)]
    r0, r1 = (TestClient(app) for app in restored)
    channel = apps[0].state.server.task(tid).channel
    for message in (sent[0], channel.seal(Kind.DONE, 0, b"")):
        answer = peer_post(r1, channel, f"/tasks/{tid}/{'verify' if message is sent[0] else 'sync'}", message)
        assert answer.status_code == 409 and all(part in answer.json()["error"] for part in RESTORED), answer.text
    assert r1.post(f"/tasks/{tid}/verify", content=b"\x05" + b"\0" * 63).status_code == 401  # no request tag: not read
    frozen = restored[0].state.server.store.frozen(tid)
    closing = r0.post(f"/tasks/{tid}/close", headers={"authorization": f"Bearer {TOKEN}"})
    assert closing.status_code == 409 and all(part in closing.json()["error"] for part in RESTORED), closing.text
    assert restored[0].state.server.store.frozen(tid) == frozen
    asked = []
    with pytest.raises(Restored):
        restored[0].state.server.task(tid).channel.exchange(Kind.CHECK_OPEN, 0, b"x", asked.append)
    assert asked == []
    listing = r1.get("/admin/tasks", headers=AUTH).json()["tasks"]
    assert [(t["task_id"], t["restored"]) for t in listing] == [(tid, "unfinished")]
    assert apps[1].state.server.store.path.parent != tmp_path / "copy1"
    assert [t["restored"] for t in TestClient(apps[1]).get("/admin/tasks", headers=AUTH).json()["tasks"]] == [None]


def test_a_restored_task_fixes_no_design_the_backup_does_not_hold(world, tmp_path):
    """Server 1 fixes a design at a first query, is backed up, fixes another kind's since; restored, it
    answers the design it holds, refuses the one it forgot (it may have been fixed otherwise: the
    budget spent twice), and still refuses another design of the kind it holds (403)."""
    from dpcdf.service.server.context import BudgetSpent
    from dpcdf.service.storage.backup import backup
    from dpcdf.service.storage.restore import Restored

    apps, _, config, _ = world
    tid = config.task_id
    st1 = apps[1].state.server.task(tid)
    assert st1.open_for_query([("groups", "A", "spent")])[1] == 12
    assert backup(st1.store.path.parent, tmp_path / "copy")["unfinished"] == 0  # verified: finished here
    st1.open_for_query([("bins", "B", "spent")])  # after the backup: the restore forgets it
    st = create_app(1, tmp_path / "copy", warm_up=False, sweep_every=1e9).state.server.task(tid)
    assert st.open_for_query([("groups", "A", "spent")])[1:] == st1.open_for_query([])[1:]
    with pytest.raises(Restored, match="holds no design for this release"):
        st.open_for_query([("bins", "B", "spent")])
    with pytest.raises(BudgetSpent):
        st.open_for_query([("groups", "C", "spent")])


def test_a_backup_is_private_even_into_an_existing_open_directory(world, tmp_path):
    """Key shares, HPKE private keys, noise seeds and the operator token: the backup's directories are
    0700 (an existing empty 0755 one is narrowed) and every file 0600."""
    import os
    import stat

    from dpcdf.service.storage.backup import backup, check

    apps, _, _, _ = world
    dest = tmp_path / "open"
    dest.mkdir(mode=0o755)
    os.chmod(dest, 0o755)
    backup(apps[1].state.server.store.path.parent, dest)
    check(dest)
    for path in [dest, *dest.rglob("*")]:
        mode = stat.S_IMODE(path.stat().st_mode)
        assert mode == (0o700 if path.is_dir() else 0o600), (path, oct(mode))


def as_old_backup(dest) -> None:
    """Makes a `dpcdf admin backup` copy what the release before the restore marks wrote: store schema 8
    without the `restored` table, a format 1 manifest listing that store's size and SHA-256."""
    import hashlib
    import json
    import sqlite3

    db = sqlite3.connect(dest / "server.sqlite", isolation_level=None)
    db.execute("DROP TABLE restored")
    db.execute("PRAGMA user_version = 8")
    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    db.close()
    for extra in ("server.sqlite-wal", "server.sqlite-shm"):
        (dest / extra).unlink(missing_ok=True)
    manifest = json.loads((dest / "MANIFEST.json").read_text())
    store = (dest / "server.sqlite").read_bytes()
    manifest["format"] = 1
    manifest["files"]["server.sqlite"] = {"sha256": hashlib.sha256(store).hexdigest(), "bytes": len(store)}
    (dest / "MANIFEST.json").write_text(json.dumps(manifest))


def test_a_backup_made_before_restore_marks_is_marked_at_its_first_start(tmp_path, capsys):
    """Review finding 1: a backup without marks (the release before them) is flagged by check-backup, and
    a server's first start on it, unchanged, marks it from its own snapshot: the two-message attack of
    finding 3 is refused (409, not 200) on the first start and after a restart."""
    from dpcdf.cli import main
    from dpcdf.service.storage.backup import backup, check
    from dpcdf.service.storage.restore import states

    copy = tmp_path / "old"
    apps, clients, config, _ = _world(tmp_path, lambda apps: backup(apps[1].state.server.store.path.parent, copy))
    as_old_backup(copy)
    assert check(copy)["marked"] is False
    assert main(["admin", "check-backup", str(copy)]) in (None, 0) and "UNMARKED" in capsys.readouterr().out
    tid = config.task_id
    shifted = _shifted_open(apps, config)
    for _ in range(2):  # the first start marks it; a restart finds the marks (its store no longer the snapshot)
        app = create_app(1, copy, warm_up=False, sweep_every=1e9)
        assert states(app.state.server.store) == {tid: "unfinished"}
        answer = peer_post(TestClient(app), apps[0].state.server.task(tid).channel, f"/tasks/{tid}/verify", shifted)
        assert answer.status_code == 409 and all(part in answer.json()["error"] for part in RESTORED), answer.text
        app.state.server.store.close()
    backup(copy, tmp_path / "new")  # a backup of the marked restore: format 2
    assert check(tmp_path / "new")["marked"] is True


def test_an_unmarked_backup_is_marked_only_while_it_is_the_snapshot(tmp_path):
    """`mark_unmarked` marks a format 1 backup whose store still has the manifest's SHA-256, in one
    transaction with the migration; a store written since (served: no longer the snapshot, whose marks
    could be read from it) is left as it is, and so is a live data directory (no manifest)."""
    import secrets
    import shutil

    from dpcdf.service.storage import Mark, Store
    from dpcdf.service.storage.backup import backup, mark_unmarked
    from dpcdf.service.storage.restore import states

    data = tmp_path / "data"
    data.mkdir()
    store = Store(data / "server.sqlite")
    for name in ("collecting", "reconciled"):
        store.add_task(name, "{}", b"f" * 32, secrets.token_bytes(32))
    store.freeze("reconciled", lambda ids: "h")
    store.mark("reconciled", Mark.RECONCILED)
    backup(data, tmp_path / "b")
    as_old_backup(tmp_path / "b")
    shutil.copytree(tmp_path / "b", tmp_path / "served")
    served = Store(tmp_path / "served" / "server.sqlite")  # opened (migrated) as by an older release's start
    served.close()
    assert mark_unmarked(tmp_path / "served") is None and states(Store(tmp_path / "served" / "server.sqlite")) == {}
    assert mark_unmarked(data) is None and store.restored is False
    assert mark_unmarked(tmp_path / "b") == 1
    marked = Store(tmp_path / "b" / "server.sqlite")
    assert marked.restored and states(marked) == {"collecting": "unfinished", "reconciled": "finished"}
    assert mark_unmarked(tmp_path / "b") is None  # once only: the store is no longer the manifest's


def test_a_restored_unfinished_task_takes_no_upload_and_its_status_says_so(tmp_path):
    """Review finding 2: server 1 backed up while the task collects; restored, a batch and a single upload
    are refused (409, saying what to do) rather than acknowledged into a task that can never be closed,
    and GET /tasks/{id} shows it restored unfinished (absent on the live server)."""
    from dpcdf.service.storage.backup import backup

    apps = tuple(create_app(p, tmp_path / f"s{p}", warm_up=False, sweep_every=1e9) for p in (0, 1))
    clients = [TestClient(a) for a in apps]
    keys = tuple(c.get("/hpke").json()["keys"]["x25519"] for c in clients)
    config = TaskConfig(GRID, 1.0, "tree", "substitution", 0, ("a", "b"), keys, token_hash(TOKEN), task_id="t2")
    for c in clients:
        assert c.post("/tasks", content=config.to_json(), headers=JSON | AUTH).status_code == 201
    backup(apps[1].state.server.store.path.parent, tmp_path / "copy")
    restored = TestClient(create_app(1, tmp_path / "copy", warm_up=False, sweep_every=1e9))
    reports = [r.to_bytes() for r in make_reports(config, values(5, 3))]
    for route, body in (("/batch", encode_batch(reports)), ("", reports[0])):
        up = restored.post(f"/tasks/t2/reports{route}", content=body)
        assert up.status_code == 409 and all(p in up.json()["error"] for p in (*RESTORED, "never register")), up.text
    analyst = {"authorization": f"Bearer {TOKEN}"}
    assert restored.get("/tasks/t2", headers=analyst).json()["restored"] == "unfinished"
    assert restored.app.state.server.store.count("t2") == 0
    assert clients[1].post("/tasks/t2/reports/batch", content=encode_batch(reports)).json()["accepted"] == 5
    assert clients[1].get("/tasks/t2", headers=analyst).json().get("restored", "absent") == "absent"
