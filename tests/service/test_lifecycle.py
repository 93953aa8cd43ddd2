"""A task's lifecycle read in one place (issue 43, `dpcdf.service.storage.lifecycle`): every phase on a
real SQLite store, driven there by the store's own methods, with what each phase allows; the restore
mark as an attribute, its SQL rule (`FINISHED`, which a backup's copy is marked with) the same as
`Lifecycle.finished`; the journal's DONE one constant."""
import secrets

import pytest

from dpcdf.service.storage import Mark, Store
from dpcdf.service.storage import restore
from dpcdf.service.storage import retention as policy
from dpcdf.service.storage.lifecycle import DONE_KIND, Phase

# task: (verify, how far it is driven)
TASKS = {
    "collecting": (True, ()),
    "frozen": (True, ("freeze",)),
    "reconciled": (False, ("freeze", Mark.RECONCILED)),  # unverified: its close is over here
    "reconciled-v": (True, ("freeze", Mark.RECONCILED)),  # verified: its check is still to come
    "reconciled-done": (True, ("freeze", Mark.RECONCILED, "done")),  # DONE alone finishes its exchange
    "verified": (True, ("freeze", Mark.RECONCILED, Mark.VERIFIED)),
    "done": (True, ("freeze", Mark.RECONCILED, Mark.VERIFIED, "done")),
    "answered": (True, ("freeze", Mark.RECONCILED, Mark.VERIFIED, Mark.ANSWERED)),
    "released": (True, ("freeze", Mark.RECONCILED, Mark.VERIFIED, "done", "released")),
    "expired": (True, ("expired",)),  # never closed: its collection closes on no report set
    "deleted": (False, ("freeze", Mark.RECONCILED, Mark.ANSWERED, "deleted")),
}

# task: phase, milestone, then what it allows: reports, close, queries, steps, check; finished, releasable, gone
EXPECTED = {
    "collecting": (Phase.COLLECTING, Phase.COLLECTING, 1, 1, 0, 1, 0, 0, 0, None),
    "frozen": (Phase.FROZEN, Phase.FROZEN, 0, 1, 0, 1, 0, 0, 0, None),
    "reconciled": (Phase.RECONCILED, Phase.RECONCILED, 0, 1, 1, 1, 0, 1, 0, None),
    "reconciled-v": (Phase.RECONCILED, Phase.RECONCILED, 0, 1, 0, 1, 1, 0, 0, None),
    "reconciled-done": (Phase.RECONCILED, Phase.RECONCILED, 0, 1, 0, 1, 1, 1, 0, None),
    "verified": (Phase.VERIFIED, Phase.VERIFIED, 0, 1, 1, 1, 1, 1, 0, None),
    "done": (Phase.VERIFIED, Phase.VERIFIED, 0, 1, 1, 1, 1, 1, 1, None),
    "answered": (Phase.ANSWERED, Phase.ANSWERED, 0, 1, 1, 1, 1, 1, 1, None),
    "released": (Phase.RELEASED, Phase.VERIFIED, 0, 1, 1, 1, 0, 1, 0, None),
    "expired": (Phase.EXPIRED, Phase.FROZEN, 0, 0, 0, 0, 0, 1, 0, "expired"),
    "deleted": (Phase.DELETED, Phase.ANSWERED, 0, 0, 0, 0, 0, 1, 0, "deleted"),
}


def _drive(store: Store) -> None:
    for task_id, (verify, steps) in TASKS.items():
        store.add_task(task_id, '{"verify": true}' if verify else "{}", b"f" * 32, secrets.token_bytes(32))
        store.add_many(task_id, [(secrets.token_bytes(16), secrets.token_bytes(48)) for _ in range(5)])
        for step in steps:
            if step == "freeze":
                store.freeze(task_id, lambda ids: "h%d" % len(ids))
            elif step == "done":
                store.record_exchange(task_id, "helper", DONE_KIND, 0, b"", b"")
            elif step in policy.REASONS:
                store.mark_purged(task_id, step)
            else:
                store.mark(task_id, step)


def _allows(life) -> tuple:
    return (life.phase, life.milestone, life.takes_reports, life.takes_close, life.answers_queries, life.takes_steps,
            life.takes_check, life.finished, life.releasable, life.gone)


def test_every_phase_is_read_in_one_place_with_what_it_allows(tmp_path):
    store = Store(tmp_path / "server.sqlite")
    _drive(store)
    lives = store.lifecycles()
    assert [life.task_id for life in lives] == list(TASKS)  # in the order they were registered
    for life in lives:
        assert life == store.lifecycle(life.task_id)
        assert _allows(life) == EXPECTED[life.task_id], life.task_id
        assert life.restored is None and not life.restored_unfinished and life.backup is None  # a live store
        assert life.collecting == (store.frozen(life.task_id) is None)
        for mark in Mark:  # Store.marked reads it too
            assert store.marked(life.task_id, mark) == life.reached(mark)
        assert policy.gone(store, life.task_id) == life.gone and policy.purge_reason(store, life.task_id) == life.purge_reason
        restore.refuse_steps(life), restore.refuse_uploads(life), restore.refuse_new_designs(store, life, ["prefix"])
    assert store.lifecycle("nope") is None and not store.marked("nope", "frozen") and policy.gone(store, "nope") is None
    with pytest.raises(ValueError):
        store.lifecycle("done").reached("closed")
    # retention and the admin listing derive from it
    assert policy.released(store) == ["done", "answered"]
    assert policy.expired(store, float("inf")) == [t for t in TASKS if t not in ("released", "expired", "deleted")]
    listing = policy.tasks(store)
    assert [t["state"] for t in listing] == [EXPECTED[t][0].value for t in TASKS]
    assert {t["state"] for t in listing} == {p.value for p in Phase}  # every phase is reached above
    assert all(t["restored"] is None for t in listing)
    store.close()


def test_the_restore_mark_is_an_attribute_and_its_sql_rule_is_finished(tmp_path):
    store = Store(tmp_path / "server.sqlite")
    _drive(store)
    finished = {life.task_id: life.finished for life in store.lifecycles()}
    with store._transaction() as db:  # as `backup` marks its copy
        assert restore.mark_copy(db, "2026-12-07T12:00:00") == (len(TASKS), sum(not f for f in finished.values()))
    store.close()
    store = Store(tmp_path / "server.sqlite")  # a server restored from it
    assert store.restored
    assert restore.states(store) == {t: "finished" if f else "unfinished" for t, f in finished.items()}
    for life in store.lifecycles():
        assert life.restored_unfinished == (not finished[life.task_id]) and life.backup == "2026-12-07T12:00:00"
        assert restore.state(life) == life.restored and restore.unfinished(life) == life.restored_unfinished
        phase, milestone, reports, close, queries, steps, check, *rest = EXPECTED[life.task_id]
        refused = life.restored_unfinished
        assert _allows(life) == (phase, milestone, reports and not refused, close and not refused, queries,
                                 steps and not refused, check and not refused, *rest)
        for refuse in (restore.refuse_steps, restore.refuse_uploads):
            if refused:
                with pytest.raises(restore.Restored, match=f"task {life.task_id} was restored from a backup "
                                                           r"\(of 2026-12-07T12:00:00\)"):
                    refuse(life)
            else:
                refuse(life)
        with pytest.raises(restore.Restored, match="holds no design for this release"):
            restore.refuse_new_designs(store, life, ["prefix"])  # none fixed in the backup
        restore.refuse_new_designs(store, life, [])
    store.close()


def test_the_journal_and_retention_share_one_done_constant():
    from dpcdf.service.protocols.channel import Kind

    assert Kind.DONE == DONE_KIND == policy.DONE_KIND == 13


def test_a_query_that_raced_a_delete_is_refused_under_the_lock(tmp_path):
    """Review of issue 43 (a gap older than the lifecycle): the analyst's 410 is read before the query
    takes the task's `answering` lock, which a purge holds; a query that passed it while the operator
    deleted the task used to answer after the delete, re-creating a release row and marking the task
    answered. `open_for_query` now refuses it there (TaskGone, 410) and writes nothing."""
    import threading
    from types import SimpleNamespace

    from dpcdf.service.server.context import TaskGone
    from dpcdf.service.server.errors import status_of
    from dpcdf.service.server.state import TaskState

    store, task = Store(tmp_path / "s.sqlite"), "t"
    store.add_task(task, '{"verify": true}', b"f" * 32, secrets.token_bytes(32))
    store.add_many(task, [(secrets.token_bytes(16), secrets.token_bytes(48)) for _ in range(6)])
    store.freeze(task, lambda ids: "h")
    store.mark(task, "reconciled")
    store.mark(task, "verified")

    class Borrowed:  # TaskState's methods on just the state they read
        def __getattr__(self, name):
            return getattr(TaskState, name).__get__(self)

    st = Borrowed()
    st.store, st.answering = store, threading.Lock()
    st.config = SimpleNamespace(task_id=task, verify=True, n_public=True, min_batch=2)
    st.source = lambda store, upto: "the histogram share"
    assert st.open_for_query([("prefix", "d", "spent")])[0] == "the histogram share"  # before the delete: answers
    policy.purge(store, task, "deleted", tmp_path)
    answered_before = store.lifecycle(task).answered_at
    rows = store.db.execute("SELECT COUNT(*) FROM releases WHERE task_id = ?", (task,)).fetchone()[0]
    with pytest.raises(TaskGone, match="deleted") as refused:
        st.open_for_query([("prefix", "d", "spent")])
    assert status_of(refused.value) == 410
    assert store.lifecycle(task).answered_at == answered_before
    assert store.db.execute("SELECT COUNT(*) FROM releases WHERE task_id = ?", (task,)).fetchone()[0] == rows
