"""`TaskContext`: one task on one server, built once (by `TaskState`) and passed whole instead of the
loose (store, config, party, pair key) that every step of the task needs. Its grid, DCFs, check and
mechanism are the config's own objects (`TaskConfig` derives each once); the context adds what is
this server's: its party, store, the key it shares with the other server, the task's channel and its
aggregator (with this server's noise seed).

The protocol steps (`protocols.reconciliation`, `protocols.check`) still take their parts one by one
(their tests and benchmarks call them so); the task's state calls them through the context. (The
background `Checker` still hands `round_one.catch_up` its parts itself: its test drives it with a
stand-in server whose tasks carry only a config and a pair key.)

Also here: the refusals of a task's state (`NotClosed`, `TooFewReports`, `BudgetSpent`), which
`errors.STATUS` answers with their HTTP status."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from fss import DCF

from ...errors import DpcdfError
from ...release.grid import Grid
from ...release.mechanisms import Mechanism
from ..hpke import ServerKeys
from ..protocols.channel import Channel
from ..protocols.check import round_one
from ..protocols.check.exchange import CheckHelper, CheckLeader
from ..protocols.check.maths import Check
from ..protocols.reconciliation import maths as reconcile
from ..protocols.reconciliation.exchange import ReconcileHelper, ReconcileLeader
from ..storage.store import Store
from ..task import TaskConfig
from .aggregate import Aggregator, Evaluator


class NotClosed(DpcdfError):
    """A query before the task is closed (reconciled, or verified): HTTP 409."""


class TooFewReports(DpcdfError):
    """Fewer reports than the task's min_batch: HTTP 403."""


class BudgetSpent(DpcdfError):
    """A release design other than the one the task's first query fixed (its groups, its round two):
    answering it would spend the budget again. HTTP 403."""


def pair_key(config: TaskConfig, party: int, keys: ServerKeys) -> bytes:
    """The key this server shares with the other one for the task (`protocols.reconciliation.maths.pair_key`), from the X25519
    part of the other's key in the config (the last 32 bytes, for either KEM)."""
    return reconcile.pair_key(keys.x25519, bytes.fromhex(config.hpke_keys[1 - party])[-32:], config.fingerprint)


@dataclass(frozen=True, eq=False)
class TaskContext:
    """What one server holds for one task, built once (`build`)."""
    config: TaskConfig
    party: int
    store: Store
    pair_key: bytes
    channel: Channel
    aggregator: Aggregator

    @classmethod
    def build(cls, config: TaskConfig, party: int, seed: bytes, noise: bool, keys: ServerKeys, store: Store,
              evaluator: Evaluator | None = None) -> "TaskContext":
        """The task's context on server `party`: its pair key (from the server's HPKE keys), its channel
        (every server-to-server message journalled in `store`), its aggregator (noise from `seed`; off
        for `noise=False`, the test-only switch), evaluating in-process or with `evaluator`."""
        key = pair_key(config, party, keys)
        channel = Channel(key, config.fingerprint, config.task_id, store, "leader" if party == 0 else "helper")
        aggregator = Aggregator(config.dcf(), config.make_mechanism(), seed, config.task_id, noise, evaluator)
        return cls(config, party, store, key, channel, aggregator)

    # --- the config's derived objects (each built once per config by TaskConfig) --------------------
    @property
    def task_id(self) -> str:
        return self.config.task_id

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

    # --- the protocol steps, handed this server's parts ---------------------------------------------
    def catch_up(self) -> int:
        """Round one of the check over the reports not yet through it (`round_one.catch_up`)."""
        return round_one.catch_up(self.store, self.config, self.party, self.pair_key)

    def round_one(self) -> round_one.Local:
        """Round one over the reconciled set, read back for the check (`round_one.prepare`)."""
        return round_one.prepare(self.store, self.config, self.party, self.pair_key)

    def reconciliation(self, on_drop: Callable[[], None],
                       on_reconciled: Callable[[], None]) -> ReconcileLeader | ReconcileHelper:
        """This server's side of the reconciliation: `on_drop` after the report set shrank, and (server
        1) `on_reconciled` once its set is final."""
        if self.party == 0:
            return ReconcileLeader(self.channel, self.store, self.task_id, self.pair_key, on_drop)
        return ReconcileHelper(self.channel, self.store, self.task_id, self.pair_key, on_drop, on_reconciled)

    def check_leader(self) -> CheckLeader:
        """Server 0's side of the report check, over its round one read back."""
        local = round_one.prepare(self.store, self.config, 0, self.pair_key)
        return CheckLeader(self.channel, self.store, self.config, self.pair_key, local)

    def check_helper(self, nonces: bytes) -> CheckHelper:
        """Server 1's side of the report check (its round one computed now), with its commitment nonces."""
        return CheckHelper(self.channel, self.store, self.config, self.pair_key, self.round_one(), nonces)

    def set_hash(self, ids: list[bytes]) -> str:
        """The keyed hash of a report set (`protocols.reconciliation.maths.set_hash`)."""
        return reconcile.set_hash(self.pair_key, ids)
