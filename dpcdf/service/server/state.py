"""What a server's requests share: its party, store and HPKE keys, the tasks it has loaded, the lock
that takes closes and queries one at a time, and whether its kernels are compiled yet."""
from __future__ import annotations

import os
import secrets
import threading
from pathlib import Path

from fss import KeyBatch, backend

from .. import reconcile
from ..aggregate import Aggregator
from .. import segments
from ..hpke import ServerKeys
from ..store import Store
from ..task import TaskConfig, token_hash
from ...errors import DpcdfError
from .errors import HttpError


class TaskState:
    """A task's config, aggregator and the cache of key shares loaded from the store."""

    def __init__(self, config: TaskConfig, party: int, seed: bytes, noise: bool, keys: ServerKeys):
        self.config = config
        self.pair_key = pair_key(config, party, keys)
        self.dcf = config.dcf()
        self.aggregator = Aggregator(self.dcf, config.make_mechanism(), seed, config.task_id, noise)
        self.shards: list[KeyBatch] = []
        self.sealed = False  # shards are the reconciled task's segments
        self.seq = 0
        self.party = party
        self.lock = threading.Lock()

    def refresh(self, store: Store, upto: int) -> list[KeyBatch]:
        """The key shares of the frozen report set (reports up to sequence number `upto`). Once the
        task is reconciled: its segments, mapped from DATA/segments/<task> (checksums verified at the
        first load; written from the store's rows the first time, or when missing or corrupt), kept
        for every later query."""
        with self.lock:
            if self.sealed:
                return list(self.shards)
            if store.marked(self.config.task_id, "reconciled"):
                self.shards = segments.open_or_build(store, self.config.task_id, self.dcf, self.party, store.path.parent)
                self.sealed = True
                return list(self.shards)
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


ADMIN_ENV = "DPCDF_ADMIN_TOKEN"


def operator_token(data: Path, path: str | Path | None) -> str:
    """The operator's token: from `path`, else $DPCDF_ADMIN_TOKEN, else DATA/admin.token (made at the
    first start, 0600). Only its hash is kept in memory."""
    if path is None and os.environ.get(ADMIN_ENV):
        return os.environ[ADMIN_ENV]
    file = Path(path) if path is not None else data / "admin.token"
    if path is None and not file.exists():
        fd = os.open(file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_urlsafe(32))
    try:
        token = file.read_text().strip()
    except OSError as exc:
        raise DpcdfError(f"cannot read the operator token file {file}: {exc}") from None
    if len(token) < 16:
        raise DpcdfError(f"the operator token in {file} is shorter than 16 characters")
    return token


class Server:
    """One server's shared state (`app.state.server`); `noise=False` is the test-only switch."""

    def __init__(self, party: int, data_dir: str | Path, noise: bool = True, admin_token_file: str | Path | None = None,
                 dask: str | None = None):
        data = Path(data_dir)
        data.mkdir(parents=True, exist_ok=True)
        self.party, self.noise = party, noise
        self.admin_hash = token_hash(operator_token(data, admin_token_file))
        self.store = Store(data / "server.sqlite")
        self.keys = ServerKeys(data)
        # evaluation on a Dask cluster ("tcp://host:8786" or "local:N"), else in-process; the noise stays here
        self.evaluator = None
        if dask is not None:
            from ..dask_eval import DaskEvaluator

            self.evaluator = DaskEvaluator(dask)
        self.answering = threading.Lock()  # closes and queries one at a time (each uses every core)
        self.warm = threading.Event()
        self._tasks: dict[str, TaskState] = {}
        self._tasks_lock = threading.Lock()

    def close(self) -> None:
        """Disconnects from the Dask cluster (and stops a local one), if any."""
        if self.evaluator is not None:
            self.evaluator.close()
            self.evaluator = None

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
                self._tasks[task_id].aggregator.evaluator = self.evaluator
            return self._tasks[task_id]
