"""What a server restored from a backup refuses (security review of issue 24, finding 3).

A backup is the store as one committed moment left it. Serving it rolls back everything the server
promised to do once after that moment: the journal of answered server-to-server steps
(`protocols.channel`), DONE, the answered mark, the designs a first query fixed. Nothing in the copy says
what was promised since, so `backup` marks the copy (`mark_copy`, in the copy only, from the snapshot
itself): one row per task it holds, saying whether the task's exchange between the servers was over then
("finished": purged, answered, DONE journalled, or its close's last mark set: verified for a verified
task, else reconciled; after that mark a server takes no new step, only replays of journalled ones and
DONE, which the rollback cannot change).

The claims, each with its attack test in tests/service/test_purge_vs_once_only.py:
- a task unfinished in the backup takes no server-to-server step on the restored server, in either role
  (`refuse_steps`: `Channel.answer_once`, `Channel.exchange`, and a close before it freezes anything).
  As server 1 it would answer again, for other content, a step answered since the backup: a deviating
  server 0 gets two answers about the same reports. As server 0 it would ask again a step whose answer
  it used since: a deviating server 1 gets V_0 computed on two inputs.
- no task the backup holds gets a release design fixed that the backup does not hold
  (`refuse_new_designs`): one fixed since could be fixed again differently, spending the budget twice
  if the other server colludes. Designs fixed in the backup, and queries that fix none, answer as before.
- a task unfinished in the backup takes no upload either (`refuse_uploads`): it can never be closed
  here, so a report acknowledged to a client would never count.
Such a task is refused with `Restored` (HTTP 409): discard it on both servers and run it again as a new
task. Unfinished includes a task still collecting at the snapshot, even if nothing happened to it since
(a backup taken while the servers were stopped): only the other server could say so, and its word is
what the mark must not rely on. A backup made before these marks (manifest format 1) is marked when a
server first starts on it unchanged (`backup.mark_unmarked`).

Trust boundary: this protects an honest operator who restores a `dpcdf admin backup`. The marker is a
table of the store: an operator who deletes its rows, or who restores a copy made otherwise (a
filesystem or VM snapshot, `cp` of the data directory: no marker), serves a rolled-back journal
unguarded. A malicious operator gains nothing by it that running other code would not give: it is the
deviating server of the threat model, and what protects the reports from it is the other server's own
journal (each server asks and answers every step once) and the check's MAC, not this marker. A task
created after the backup is unknown to the restored server: never register it again under the same id,
run it as a new task (registered afresh, it would answer again steps it answered before the restore, and
a deviating other server need not have discarded the task to ask them).

Cost: a Store caches at open whether the table has rows (`Store.restored`); a live store's is empty and a
running server never writes it, so a live server's `Store.lifecycle` does no lookup in it. Each refusal
below takes the task's `Lifecycle` (`storage.lifecycle`: its `restored` and `backup`), None for an unknown
task."""
from __future__ import annotations

import sqlite3
from typing import Sequence

from .lifecycle import FINISHED, Lifecycle
from .records import StoreError
from .store import Store

# the snapshot's view of each task, as `restored` rows: finished when nothing but replays and DONE is left
_MARK = f"""
INSERT OR IGNORE INTO restored (task_id, finished, backup)
SELECT t.task_id, {FINISHED}, ?
FROM tasks t
"""


_AGAIN = ("Discard the task on both servers (dpcdf admin delete) and run it again as a new task, under a new id: "
          "never register this id again")


class Restored(StoreError):
    """A restored task's step or new design, refused (HTTP 409): the server may have promised otherwise
    after the backup it was restored from."""


def mark_copy(db: sqlite3.Connection, backup: str) -> tuple[int, int]:
    """Marks a backup's store (its own connection, schema at the latest version) with each task's state
    at the snapshot; a task marked by an earlier backup keeps its mark. Returns (tasks, unfinished)."""
    db.execute(_MARK, (backup,))
    tasks, unfinished = db.execute("SELECT COUNT(*), COUNT(*) - TOTAL(finished) FROM restored").fetchone()
    return tasks, int(unfinished)


def _unfinished_in(life: Lifecycle | None) -> str | None:
    """When the backup was taken, if the task was restored from one before its exchange was over."""
    return life.backup if life is not None and life.restored_unfinished else None


def unfinished(life: Lifecycle | None) -> bool:
    """Whether the task was restored from a backup taken before its exchange between the servers was over."""
    return _unfinished_in(life) is not None


def refuse_steps(life: Lifecycle | None) -> None:
    """`Restored` if the task was unfinished in the backup this store was restored from."""
    taken = _unfinished_in(life)
    if taken is not None and life is not None:
        raise Restored(f"task {life.task_id} was restored from a backup (of {taken}) taken before its close was over: "
                       "(collecting or closing): this server may have answered or asked its server-to-server steps "
                       f"since, and takes none again. {_AGAIN}")


def refuse_uploads(life: Lifecycle | None) -> None:
    """`Restored` for a report upload to a task unfinished in the backup: it can never be closed here, so
    a report acknowledged to a client would never count."""
    taken = _unfinished_in(life)
    if taken is not None and life is not None:
        raise Restored(f"task {life.task_id} was restored from a backup (of {taken}) taken before its close was over "
                       f"(collecting or closing): it can never be closed here, so its reports are refused. {_AGAIN}")


def state(life: Lifecycle | None) -> str | None:
    """'finished' or 'unfinished' for a task restored from a backup, else None (GET /tasks/{id})."""
    return None if life is None else life.restored


def refuse_new_designs(store: Store, life: Lifecycle | None, kinds: Sequence[str]) -> None:
    """`Restored` if the task is in the backup this store was restored from and one of these release
    kinds has no design fixed there (it may have been fixed since, otherwise)."""
    if life is None or life.restored is None or not kinds:
        return
    if not set(kinds) <= store.fixed_designs(life.task_id):
        raise Restored(f"task {life.task_id} was restored from a backup (of {life.backup}) that holds no design for this "
                       "release: a first query may have fixed one since, so this server fixes none. Queries "
                       "whose design the backup holds are answered as before; for this release run the task "
                       "again as a new task on both servers")


def states(store: Store) -> dict[str, str]:
    """'finished' or 'unfinished' per task restored from a backup (for the admin listing)."""
    return {life.task_id: life.restored for life in store.lifecycles() if life.restored is not None}
