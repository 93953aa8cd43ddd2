"""`StepContext`: what every protocol step of one task on one server is handed, whole, instead of the
loose (store, config, party, pair key) (issue 23): the task's config, this server's party and store,
the key it shares with the other server, and the task's channel (every server-to-server message,
journalled in the store).

The server builds one per task (`server.context.TaskContext` is one, with the task's aggregator
besides); tests and benchmarks build theirs with `StepContext.of`. A step reads only these
attributes, so any object that has them will do."""
from __future__ import annotations

from dataclasses import dataclass

from ..storage.store import Store
from ..task import TaskConfig
from .channel import Channel


@dataclass(frozen=True, eq=False)
class StepContext:
    """One task on one server, as its protocol steps see it."""
    config: TaskConfig
    party: int
    store: Store
    pair_key: bytes
    channel: Channel

    @staticmethod
    def channel_of(config: TaskConfig, party: int, store: Store, pair_key: bytes) -> Channel:
        """The task's channel on server `party` (leader on 0, helper on 1), journalled in `store`."""
        return Channel(pair_key, config.fingerprint, config.task_id, store, "leader" if party == 0 else "helper")

    @classmethod
    def of(cls, config: TaskConfig, party: int, store: Store, pair_key: bytes) -> "StepContext":
        """The context of the task `config` on server `party`, with its channel."""
        return cls(config, party, store, pair_key, cls.channel_of(config, party, store, pair_key))

    @property
    def task_id(self) -> str:
        return self.config.task_id
