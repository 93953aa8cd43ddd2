"""A task's lifecycle on one server, read in one place (issue 43, first step: the schema is unchanged).

`Store.lifecycle(task_id)` reads it in one query (`Store.lifecycles()`: every task's, in one query);
every refusal that depends on where a task is (uploads, closes, queries, server-to-server steps, the
operator's listing and retention) reads the `Lifecycle` it returns. The `takes_*` and `answers_queries`
properties below state the rules; the refusals themselves (in the server's state, routers and
retention) test the underlying fields (`collecting`, `ready`, `gone`, ...), and `tests/service/
test_lifecycle.py` checks both on every phase (review of issue 43: the properties are not yet what the
refusals call).

Where each phase comes from (table `tasks` unless said), in the order a task reaches them:
- COLLECTING ('collecting'): `closed_at` is NULL: no report set is fixed yet.
- FROZEN ('closed'): `closed_at` (with `frozen_seq`, `report_count`, `set_hash`, all or none): `Store.freeze`
  fixed the report set (the analyst's close on server 0, the reconciliation's first step on server 1).
- RECONCILED: `reconciled_at`: both servers hold one report set (`Store.mark`).
- VERIFIED: `verified_at`: a verified task's report check is done and its failures excluded.
- ANSWERED: `answered_at`: a query was answered; the report set can no longer shrink.
- RELEASED, EXPIRED, DELETED: `purge_reason` (set with `purged_at`, `storage.retention`): the task's key
  shares are deleted. A released task (verified, its close over) still answers queries from its
  histogram share; an expired or deleted one ('gone') answers nothing again.
`milestone` is the last of the first five a task reached (kept under a purge); `phase` is the purge
reason if any, else the milestone. The values are the names the admin API and /metrics show.

Beside the phase:
- `done`: table `exchanges`: a DONE step (`DONE_KIND`) is journalled, in either role: server 0 said
  the close is over. Its exchange stays finished (retention keeps that row).
- `restored`: table `restored`, only on a server restored from a backup (`storage.restore`): 'finished'
  or 'unfinished' (the task's exchange was not over when the backup was taken), with `backup` (when).
- `verify`: the task's config (`verify`): which mark ends its close (`ready`).

What each phase allows (the refusals are raised by the server's state, routers and retention):
- reports: COLLECTING only (`takes_reports`); later 409 (closed, or the gone reason).
- close: every phase but EXPIRED and DELETED (`takes_close`: the analyst gets 410); FROZEN to ANSWERED
  resume or repeat it (idempotent).
- queries: once `ready` (RECONCILED for an unverified task, VERIFIED for a verified one) and not gone
  (`answers_queries`); before, 409 (not closed); gone, 410.
- server-to-server steps (server 1's reconciliation, DONE): not gone (`takes_steps`; gone: 400 as a
  forged message); once the exchange is finished (DONE answered, or a query answered) the journal
  answers replays only (`protocols.channel`). The report check's messages also need a verified,
  reconciled task that is not released (`takes_check`).
- a task restored unfinished from a backup (`restored_unfinished`) takes no upload, close or step
  (409 `Restored`); any restored task fixes no release design the backup does not hold.
- retention: `releasable` (verified, close over on this server, not purged) is released by the sweep;
  a task not purged (`purge_reason` None) expires after `--retention`."""
from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from .records import Mark

DONE_KIND = 13  # the journal's DONE step (`protocols.channel.Kind.DONE` is this value): the lower layer owns it
REASONS = ("released", "expired", "deleted")  # `purge_reason`
GONE = ("expired", "deleted")  # tasks that answer nothing again


class Phase(str, Enum):
    """Where a task is on this server (see the module for the column each comes from)."""
    COLLECTING = "collecting"
    FROZEN = "closed"
    RECONCILED = "reconciled"
    VERIFIED = "verified"
    ANSWERED = "answered"
    RELEASED = "released"
    EXPIRED = "expired"
    DELETED = "deleted"


# the milestones, last first: a task's milestone is the first of these whose column is set
_MILESTONES = ((Phase.ANSWERED, "answered_at"), (Phase.VERIFIED, "verified_at"), (Phase.RECONCILED, "reconciled_at"),
               (Phase.FROZEN, "closed_at"))
# each mark's column (`Store.mark` writes it, `Lifecycle.reached` reads it)
MARK_COLUMN = {Mark.FROZEN: "closed_at", Mark.RECONCILED: "reconciled_at", Mark.VERIFIED: "verified_at",
               Mark.ANSWERED: "answered_at"}

_FIELDS = ("task_id", "verify", "created", "closed_at", "reconciled_at", "verified_at", "answered_at", "purged_at",
           "purge_reason", "done", "restored", "backup")
_DONE = f"EXISTS (SELECT 1 FROM exchanges e WHERE e.task_id = t.task_id AND e.role IN ('leader', 'helper') AND e.kind = {DONE_KIND})"


def select(restored: bool) -> str:
    """The one query of a task's lifecycle (add `WHERE t.task_id = ?` or an ORDER BY), its columns in
    `Lifecycle`'s field order. `restored`: whether the store holds restore marks at all (a live store's
    `restored` table is empty: no join)."""
    marks = "r.finished, r.backup FROM tasks t LEFT JOIN restored r ON r.task_id = t.task_id" if restored \
        else "NULL, NULL FROM tasks t"
    return ("SELECT t.task_id, coalesce(json_extract(t.config, '$.verify'), 0), t.created, t.closed_at, t.reconciled_at, "
            f"t.verified_at, t.answered_at, t.purged_at, t.purge_reason, {_DONE}, {marks}")


# `Lifecycle.finished` in SQL, over `tasks t` (the restore marks a backup's copy takes, `restore.mark_copy`)
FINISHED = ("t.purge_reason IS NOT NULL OR t.answered_at IS NOT NULL "
            "OR (CASE WHEN json_extract(t.config, '$.verify') THEN t.verified_at ELSE t.reconciled_at END) IS NOT NULL "
            f"OR {_DONE}")


@dataclass(frozen=True)
class Lifecycle:
    """One task's lifecycle as the store holds it (`Store.lifecycle`): its times, purge reason, DONE and
    restore mark, and what they allow."""
    task_id: str
    verify: bool
    created: float
    closed_at: float | None
    reconciled_at: float | None
    verified_at: float | None
    answered_at: float | None
    purged_at: float | None
    purge_reason: str | None
    done: bool
    restored: str | None  # 'finished', 'unfinished' (on a store restored from a backup), else None
    backup: str | None  # when that backup was taken

    @classmethod
    def from_row(cls, row: tuple) -> Lifecycle:
        values = dict(zip(_FIELDS, row))
        finished = values["restored"]
        values.update(verify=bool(values["verify"]), done=bool(values["done"]),
                      restored=None if finished is None else "finished" if finished else "unfinished")
        return cls(**values)

    # --- the phase ------------------------------------------------------------------------------
    @property
    def milestone(self) -> Phase:
        """The last of COLLECTING, FROZEN, RECONCILED, VERIFIED, ANSWERED reached (a purge keeps it)."""
        return next((phase for phase, column in _MILESTONES if getattr(self, column) is not None), Phase.COLLECTING)

    @property
    def phase(self) -> Phase:
        """The purge reason's phase if the key shares are deleted, else the milestone."""
        return Phase(self.purge_reason) if self.purge_reason else self.milestone

    def reached(self, mark: Mark | str) -> bool:
        """Whether the task reached a milestone (a `Mark` or its value; ValueError for another)."""
        return getattr(self, MARK_COLUMN[Mark.parse(mark)]) is not None

    @property
    def collecting(self) -> bool:
        """No report set fixed yet (a gone task's collection is closed on no report set)."""
        return self.closed_at is None

    @property
    def ready(self) -> bool:
        """The close is over on this server: VERIFIED for a verified task, else RECONCILED."""
        return self.reached(Mark.VERIFIED if self.verify else Mark.RECONCILED)

    @property
    def gone(self) -> str | None:
        """'expired' or 'deleted' for a task that answers nothing again, else None."""
        return self.purge_reason if self.purge_reason in GONE else None

    @property
    def finished(self) -> bool:
        """The task's exchange between the servers is over: nothing but replays and DONE is left (purged,
        answered, `ready`, or DONE journalled). A backup marks each task with it (`FINISHED` in SQL)."""
        return self.purge_reason is not None or self.answered_at is not None or self.ready or self.done

    @property
    def restored_unfinished(self) -> bool:
        """Restored from a backup taken before its exchange was over: it takes no upload, close or step."""
        return self.restored == "unfinished"

    @property
    def releasable(self) -> bool:
        """Retention releases its key shares: verified, its close over on this server (DONE journalled, or
        a query answered), not purged yet."""
        return self.purge_reason is None and self.verified_at is not None and (self.answered_at is not None or self.done)

    # --- what it allows (see the module) ------------------------------------------------------------
    @property
    def takes_reports(self) -> bool:
        return self.collecting and not self.restored_unfinished

    @property
    def takes_close(self) -> bool:
        return self.gone is None and not self.restored_unfinished

    @property
    def answers_queries(self) -> bool:
        return self.ready and self.gone is None

    @property
    def takes_steps(self) -> bool:
        return self.gone is None and not self.restored_unfinished

    @property
    def takes_check(self) -> bool:
        return (self.takes_steps and self.verify and self.reached(Mark.RECONCILED)
                and self.purge_reason is None)

    def times(self) -> dict:
        """The task's id, phase (as `state`) and times, as the admin listing shows them."""
        return {"task_id": self.task_id, "created": self.created, "closed_at": self.closed_at,
                "reconciled_at": self.reconciled_at, "verified_at": self.verified_at, "answered_at": self.answered_at,
                "purged_at": self.purged_at, "purge_reason": self.purge_reason, "state": self.phase.value}
