"""The server's retention sweep and the operator's task management (issue 24), over
`dpcdf.service.storage.retention` (what is deleted, when, and how a crash mid-way is finished).

`Retention` runs one background thread: at the start it finishes any interrupted purge, then every
`every` seconds it deletes the key shares of verified tasks whose release is final ('released') and,
with `keep` set (`dpcdf serve --retention 30d`), of every task registered more than `keep` ago that
still holds key shares ('expired'). The operator's `delete` does the same at once ('deleted'). A purge
takes the task's `answering` lock (so no close or query of the task is half-way) and drops the
shares the server holds in memory (mapped segments, a helper's round one) with it.

Who may call what: the sweep is the server's own; `delete`, `close_task`, `sweep` and `tasks` are
reached only through the admin routes, behind the operator's token (`deps.operator`)."""
from __future__ import annotations

import logging
import os
import threading
import time
from collections import Counter
from contextlib import nullcontext
from pathlib import Path
from typing import TYPE_CHECKING

from ..storage import retention as policy
from ..storage.records import UnknownTask
from .errors import TaskNotFound

if TYPE_CHECKING:
    from .state import Server

log = logging.getLogger("dpcdf.retention")
CRASH_ENV = "DPCDF_TESTING_CRASH_AFTER_PURGE_COMMIT"  # test-only (with DPCDF_TESTING=1): exit between the two steps
SWEEP_EVERY = 60.0


class Retention:
    def __init__(self, server: "Server", data_dir: str | Path, keep: float | None = None, every: float = SWEEP_EVERY):
        self.server, self.data, self.keep, self.every = server, Path(data_dir), keep, every
        self.purged: Counter = Counter()  # by reason, since the start (for /metrics)
        self.sweeps = self.failures = 0
        self._lock = threading.Lock()  # one sweep or delete at a time
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="retention", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.sweep()
            except Exception:  # noqa: BLE001 - logged and counted; the next sweep tries again
                self.failures += 1
                log.exception("the retention sweep failed; it runs again in %s s", self.every)
            self._stop.wait(self.every)

    def sweep(self) -> list[policy.Purged]:
        """Finishes interrupted purges, then purges released and (with `keep`) expired tasks."""
        with self._lock:
            store = self.server.store
            policy.recover(store, self.data)
            out = [self._purge(t, "released") for t in policy.released(store)]
            if self.keep is not None:
                out += [self._purge(t, "expired") for t in policy.expired(store, time.time() - self.keep)]
            self.sweeps += 1
        for p in out:
            log.info("task %s: %s; %d report rows and %d segment files deleted", p.task_id, p.reason, p.reports, p.files)
        return out

    def delete(self, task_id: str) -> policy.Purged:
        """The operator's delete: 404 for an unknown task; a deleted task again deletes nothing more."""
        with self._lock:
            try:
                return self._purge(task_id, "deleted")
            except UnknownTask:
                raise TaskNotFound(task_id) from None

    def _purge(self, task_id: str, reason: str) -> policy.Purged:
        st = self.server.loaded(task_id)  # loaded state, if any: its close or query finishes first
        with st.answering if st is not None else nullcontext():
            done = policy.purge(self.server.store, task_id, reason, self.data, after_commit=_crash_point)
            if st is not None:
                st.forget_keys()  # unmaps the (now unlinked) segments, drops a helper's round one
                if reason in policy.GONE:
                    self.server.unload(task_id)
        self.purged[reason] += 1
        return done

    def gone(self, task_id: str) -> str | None:
        return policy.gone(self.server.store, task_id)

    def tasks(self, counts: bool = True) -> list[dict]:
        """`retention.tasks`, each with `restored`: on a server restored from a backup, whether the task was
        finished in it ('finished', or 'unfinished': it takes no step again), else None."""
        return policy.tasks(self.server.store, counts)


def _crash_point() -> None:
    if os.environ.get("DPCDF_TESTING") == "1" and os.environ.get(CRASH_ENV) == "1":
        os._exit(3)  # as a crash: the purge's transaction is committed, its files are not removed yet
