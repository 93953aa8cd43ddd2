"""`TaskContext`: one task on one server, built once (by `TaskState`) and passed whole instead of the
loose (store, config, party, pair key) that every step of the task needs. Its grid, DCFs, check and
mechanism are the config's own objects (`TaskConfig` derives each once); the context adds what is
this server's: its party, store, the key it shares with the other server, the task's channel and its
aggregator (with this server's noise seed).

It is the protocols' own context (`protocols.context.StepContext`, which the protocol steps of
`protocols.reconciliation` and `protocols.check` take whole) with the aggregator besides, so the task's
state hands the steps the context itself.

Also here: the refusals of the server's state (`TaskNotFound`, `NotClosed`, `TooFewReports`,
`BudgetSpent`, `CloseRefused`, `PeerFailed`), which `errors.STATUS` answers with their HTTP status."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from fss import DCF

from ...errors import DpcdfError
from ...release.grid import Grid
from ...release.mechanisms import Mechanism
from ..hpke import ServerKeys
from ..protocols import grid_sums
from ..protocols.check import round_one
from ..protocols.check.exchange import CheckHelper, CheckLeader
from ..protocols.context import StepContext
from ..protocols.reconciliation import maths as reconcile
from ..protocols.reconciliation.exchange import ReconcileHelper, ReconcileLeader
from ..storage.store import Store
from ..task import TaskConfig
from ..verification.maths import Check
from .aggregate import Aggregator, Evaluator


class TaskNotFound(DpcdfError):
    """No task with this id on this server (`Server.task`, the operator's delete): HTTP 404."""

    def __init__(self, task_id: str):
        super().__init__(f"unknown task {task_id}")
        self.task_id = task_id


class NotClosed(DpcdfError):
    """A query before the task is closed (reconciled, or verified): HTTP 409."""


class TaskGone(DpcdfError):
    """A query of a task whose reports are deleted (by its operator, by retention, or released): HTTP
    410. The analyst's dependency answers it before the query; the query checks again under the task's
    `answering` lock, which a purge holds, so one that raced the delete cannot answer after it."""


def gone_message(task_id: str, why: str) -> str:
    """The 410's text for a task whose reports are deleted (`why`: 'expired' or 'deleted'), one wording
    whether the analyst's dependency or the query under its lock (`TaskGone`) finds it."""
    return f"task {task_id} is {why}: its reports are deleted and it answers nothing again"


class TooFewReports(DpcdfError):
    """Fewer reports than the task's min_batch (a query, or a close before the freeze): HTTP 403."""


class BudgetSpent(DpcdfError):
    """A release design other than the one the task's first query fixed (its groups, its round two):
    answering it would spend the budget again. HTTP 403."""


class CloseRefused(DpcdfError):
    """Server 1 refused a step of the close (it cannot drop any more reports, it finished already):
    HTTP 409."""


class PeerFailed(DpcdfError):
    """Server 1 did not take part in the close: no answer, or one that is not its own or does not
    fit the protocol. HTTP 502."""


def pair_key(config: TaskConfig, party: int, keys: ServerKeys) -> bytes:
    """The key this server shares with the other one for the task (`protocols.reconciliation.maths.pair_key`), from the X25519
    part of the other's key in the config (the last 32 bytes, for either KEM)."""
    return reconcile.pair_key(keys.x25519, bytes.fromhex(config.hpke_keys[1 - party])[-32:], config.fingerprint)


@dataclass(frozen=True, eq=False)
class TaskContext(StepContext):
    """What one server holds for one task, built once (`build`): the protocol steps' context (config,
    party, store, pair key, channel) and the task's aggregator."""
    aggregator: Aggregator

    @classmethod
    def build(cls, config: TaskConfig, party: int, seed: bytes, noise: bool, keys: ServerKeys, store: Store,
              evaluator: Evaluator | None = None) -> "TaskContext":
        """The task's context on server `party`: its pair key (from the server's HPKE keys), its channel
        (every server-to-server message journalled in `store`), its aggregator (noise from `seed`; off
        for `noise=False`, the test-only switch), evaluating in-process or with `evaluator`."""
        key = pair_key(config, party, keys)
        channel = cls.channel_of(config, party, store, key)
        aggregator = Aggregator(config.dcf(), config.make_mechanism(), seed, config.task_id, noise, evaluator)
        return cls(config, party, store, key, channel, aggregator)

    # --- the config's derived objects (each built once per config by TaskConfig) --------------------
    @property
    def grid(self) -> Grid:
        return self.config.make_grid()

    @property
    def dcf(self) -> DCF:
        """What the reports' keys are (a verified task's also carry the check's MAC: `TaskConfig.key_dcf`)."""
        return self.config.key_dcf()

    @property
    def check(self) -> Check:
        """The report check of a verified task (ParameterError for an unverified payload)."""
        return self.config.check()

    @property
    def mechanism(self) -> Mechanism:
        return self.aggregator.mechanism

    @property
    def round_one_map(self) -> Callable[["TaskContext"], int] | None:
        """Where `round_one.catch_up` runs the check's batches: the server's Dask cluster
        (`dask_check.RoundOneMap`), or None, in-process."""
        return getattr(self.aggregator.evaluator, "round_one", None)

    @property
    def batched(self) -> bool:
        """Whether this server evaluates the task's reports in batches while they arrive: a verified
        task's round one of the check, an unverified one's grid sums on grids of up to GRID_SUMS_MAX
        (`protocols.grid_sums`; on a server with a Dask evaluator its close makes the histogram share
        on the cluster instead, `histograms`)."""
        return self.config.verify or (grid_sums.ring_sums(self) is not None and self.aggregator.evaluator is None)

    # --- the protocol steps, handed this context ---------------------------------------------------
    def catch_up(self) -> int:
        """The batches of the reports not yet in one: round one of the check (`round_one.catch_up`), or
        an unverified task's grid sums (`grid_sums.catch_up`); 0 if the task is not `batched`."""
        if self.config.verify:
            return round_one.catch_up(self)
        return grid_sums.catch_up(self) if self.batched else 0

    def round_one(self) -> round_one.Local:
        """Round one over the reconciled set, read back for the check (`round_one.prepare`)."""
        return round_one.prepare(self)

    def reconciliation(self, on_drop: Callable[[], None],
                       on_reconciled: Callable[[], None]) -> ReconcileLeader | ReconcileHelper:
        """This server's side of the reconciliation: `on_drop` after the report set shrank, and (server
        1) `on_reconciled` once its set is final."""
        if self.party == 0:
            return ReconcileLeader(self, on_drop)
        return ReconcileHelper(self, on_drop, on_reconciled)

    def check_leader(self) -> CheckLeader:
        """Server 0's side of the report check, over its round one read back."""
        return CheckLeader(self, self.round_one())

    def check_helper(self, nonces: bytes) -> CheckHelper:
        """Server 1's side of the report check (its round one computed now), with its commitment nonces."""
        return CheckHelper(self, self.round_one(), nonces)

    def set_hash(self, ids: list[bytes]) -> str:
        """The keyed hash of a report set (`protocols.reconciliation.maths.set_hash`)."""
        return reconcile.set_hash(self.pair_key, ids)
