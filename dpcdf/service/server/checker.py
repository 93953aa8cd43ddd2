"""The batches of tasks' reports in the background, while they arrive (`Checker`): round one of a verified
task's check, an unverified one's grid sums (`TaskContext.batched`, `protocols.grid_sums`)."""
from __future__ import annotations

import logging
import threading
from typing import Protocol

from ..protocols import grid_sums
from ..protocols.check import round_one
from ..storage.store import Store
from ..task import TaskConfig
from .context import TaskContext

log = logging.getLogger("dpcdf.server")


class _Task(Protocol):
    ctx: TaskContext


class Tasks(Protocol):
    """What the worker needs of the server (`state.Server` is one): its store and each task's state,
    whose context the batches take whole. Narrow on purpose: the checker does not import the state,
    which imports it."""
    store: Store

    def task(self, task_id: str) -> _Task: ...


class Checker:
    """Tasks' batches while their reports arrive (`protocols.check.round_one` for a verified task, `protocols.grid_sums`
    for an unverified one on a grid of up to GRID_SUMS_MAX points), in one background thread: an upload
    wakes it for its task; at start it takes every task whose batches may be behind (its check not done,
    or an unverified one still collecting or closing: reports stored while the server was down, or
    before this version). A close catches up on what is left itself (`round_one.prepare`,
    `grid_sums.histogram`), so the worker only moves work out of the close; a failure here is logged
    and retried at the next upload or close, never lost."""

    def __init__(self, server: Tasks):
        self.server = server
        self._pending: set[str] = set()
        self._wake = threading.Condition()
        self.busy = False
        threading.Thread(target=self._run, name="round-one", daemon=True).start()

    def wake(self, task_id: str) -> None:
        with self._wake:
            self._pending.add(task_id)
            self._wake.notify()

    def backlog(self) -> bool:
        """Whether round one has work queued or running (what /health shows as `checking`)."""
        with self._wake:
            return bool(self._pending) or self.busy

    def _behind(self, task_id: str, config: TaskConfig) -> bool:
        """At the start: whether the task may have reports not in a batch that a later close needs (a
        verified task not verified yet; an unverified one on a small enough grid, not purged, whose
        close is not over: its histogram share, if missing, is made again where it is needed)."""
        if config.verify:
            return True
        life = self.server.store.lifecycle(task_id)
        return life is not None and grid_sums.summed(config) and life.purge_reason is None and not life.ready

    def _run(self) -> None:
        try:
            for task_id, config in self.server.store.tasks_to_check():
                if self._behind(task_id, TaskConfig.from_json(config)):
                    self.wake(task_id)
        except Exception:  # noqa: BLE001 - a store that cannot be read fails the requests, not this thread
            log.exception("round one: cannot list the tasks to check")
        while True:
            with self._wake:
                while not self._pending:
                    self._wake.wait()
                task_id = self._pending.pop()
                self.busy = True
            try:
                ctx, store = self.server.task(task_id).ctx, self.server.store
                if ctx.config.verify:
                    if not store.marked(task_id, "verified"):
                        round_one.catch_up(ctx)
                elif ctx.batched and not store.marked(task_id, "reconciled"):  # a close over needs no batch
                    grid_sums.catch_up(ctx)
            except Exception:  # noqa: BLE001 - retried at the next upload or at the close
                log.exception("the batches of task %s failed; the close will do them", task_id)
            finally:
                with self._wake:
                    self.busy = False
