"""Round one of verified tasks' reports in the background, while they arrive (`Checker`)."""
from __future__ import annotations

import logging
import threading
from typing import Protocol

from ..protocols.check import round_one
from ..protocols.context import StepContext
from ..storage.store import Store
from ..task import TaskConfig

log = logging.getLogger("dpcdf.server")


class _Task(Protocol):
    ctx: StepContext


class Tasks(Protocol):
    """What the worker needs of the server (`state.Server` is one): its store and each task's state,
    whose context round one takes whole. Narrow on purpose: the checker does not import the state,
    which imports it."""
    store: Store

    def task(self, task_id: str) -> _Task: ...


class Checker:
    """Round one of verified tasks' reports while they arrive (`protocols.check.round_one`), in one background
    thread: an upload wakes it for its task; at start it takes every task whose check is not done
    (reports stored while the server was down, or before this version). A close catches up on what
    is left itself (`round_one.prepare`), so the worker only moves work out of the close; a failure
    here is logged and retried at the next upload or close, never lost."""

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

    def _run(self) -> None:
        try:
            for task_id, config in self.server.store.tasks_to_check():
                if TaskConfig.from_json(config).verify:
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
                ctx = self.server.task(task_id).ctx
                if ctx.config.verify and not self.server.store.marked(task_id, "verified"):
                    round_one.catch_up(ctx)
            except Exception:  # noqa: BLE001 - retried at the next upload or at the close
                log.exception("round one of task %s failed; the close will do it", task_id)
            finally:
                with self._wake:
                    self.busy = False
