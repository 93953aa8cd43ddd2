"""What a server's requests share: its party, store and HPKE keys, the tasks it has loaded, the lock
that takes closes and queries one at a time, and whether its kernels are compiled yet."""
from __future__ import annotations

import threading
from pathlib import Path

from fss import KeyBatch, backend

from .. import reconcile
from ..aggregate import Aggregator
from ..hpke import ServerKeys
from ..store import Store
from ..task import TaskConfig
from .errors import HttpError


class TaskState:
    """A task's config, aggregator and the cache of key shares loaded from the store."""

    def __init__(self, config: TaskConfig, party: int, seed: bytes, noise: bool, keys: ServerKeys):
        self.config = config
        self.pair_key = pair_key(config, party, keys)
        self.dcf = config.dcf()
        self.aggregator = Aggregator(self.dcf, config.make_mechanism(), seed, config.task_id, noise)
        self.shards: list[KeyBatch] = []
        self.seq = 0
        self.party = party
        self.lock = threading.Lock()

    def refresh(self, store: Store, upto: int) -> list[KeyBatch]:
        """The key shares of the frozen report set (reports up to sequence number `upto`)."""
        with self.lock:
            shares, self.seq = store.shares_since(self.config.task_id, self.seq, upto)
            if shares:
                self.shards.append(self.dcf.batch_from_keys(shares, self.party))
                if len(self.shards) > 8:
                    self.shards = [KeyBatch.concatenate(self.shards)]
            return list(self.shards)

    def set_hash(self, ids: list[bytes]) -> str:
        return reconcile.set_hash(self.pair_key, ids)


def pair_key(config: TaskConfig, party: int, keys: ServerKeys) -> bytes:
    """The key this server shares with the other one for the task (`reconcile`), from the X25519
    part of the other's key in the config (the last 32 bytes, for either KEM)."""
    return reconcile.pair_key(keys.x25519, bytes.fromhex(config.hpke_keys[1 - party])[-32:], config.fingerprint)


class Server:
    """One server's shared state (`app.state.server`); `noise=False` is the test-only switch."""

    def __init__(self, party: int, data_dir: str | Path, noise: bool = True):
        data = Path(data_dir)
        data.mkdir(parents=True, exist_ok=True)
        self.party, self.noise = party, noise
        self.store = Store(data / "server.sqlite")
        self.keys = ServerKeys(data)
        self.answering = threading.Lock()  # closes and queries one at a time (each uses every core)
        self.warm = threading.Event()
        self._tasks: dict[str, TaskState] = {}
        self._tasks_lock = threading.Lock()

    def warm_up(self) -> None:
        """Compiles the kernels in the background, while reports arrive."""
        def run() -> None:
            backend.warm_up()
            self.warm.set()

        threading.Thread(target=run, name="warm-up", daemon=True).start()

    def task(self, task_id: str) -> TaskState:
        """The task's state, loaded from the store the first time; 404 for an unknown task."""
        with self._tasks_lock:
            if task_id not in self._tasks:
                row = self.store.task(task_id)
                if row is None:
                    raise HttpError(404, f"unknown task {task_id}")
                self._tasks[task_id] = TaskState(TaskConfig.from_json(row[0]), self.party, row[1], self.noise, self.keys)
            return self._tasks[task_id]
