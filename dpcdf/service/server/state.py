"""What a server's requests share: its party, store and HPKE keys, the tasks it has loaded (each with
the lock that takes its close and its queries one at a time), the per-analyst limit on expensive
requests, and whether its kernels are compiled yet.

No request holds a server-wide lock while it works: a task's state is built outside the table's lock
(once per task id), and one task's close or query never waits for another task's."""
from __future__ import annotations

import hashlib
import hmac
import logging
import os
import secrets
import threading
from fractions import Fraction
from pathlib import Path
from typing import Callable

from fss import KeyBatch, backend

import numpy as np

from ...errors import DpcdfError
from ...release.noise import prf_key, prf_noise
from ..hpke import ServerKeys
from ..protocols.channel import CHECK, RECONCILIATION, Kind, Message, NotReady, Refused, Unopened
from ..protocols.check import round_one
from ..protocols.check.exchange import CheckHelper, CheckLeader, ready_mark
from ..protocols.reconciliation.exchange import ReconcileHelper, ReconcileLeader, finish, say_done
from ..protocols.reconciliation.maths import SyncError
from ..storage import restore, segments
from ..storage.lifecycle import Lifecycle
from ..storage.records import CollectionClosed, Frozen, Mark
from ..storage.store import Store
from ..task import TaskConfig, token_hash
from .access import ANALYST_LIMIT, ANALYST_LIMIT_ENV, Limiter, Throttled, operator_token  # noqa: F401 (Throttled: its old home)
from .aggregate import Evaluator, Histogram
from .checker import Checker
from .context import BudgetSpent, NotClosed, TaskContext, TooFewReports, pair_key  # noqa: F401 (pair_key: its old home)
from .context import CloseRefused, PeerFailed, TaskGone, TaskNotFound, gone_message
from .errors import HttpError
from .histograms import HistogramShare
from .ownership import claim_party
from .peer_gate import PeerGate

log = logging.getLogger("dpcdf.server")

CLOSED = "collection is closed: the analyst has closed the task"


def closed_because(srv: "Server", task_id: str) -> str:
    """Why a task takes no more reports: CLOSED, or its key shares deleted by the operator or expired."""
    life = srv.store.lifecycle(task_id)
    why = {"deleted": "deleted by this server's operator", "expired": "expired (this server's retention)"}.get(
        life.gone if life is not None and life.gone else "")
    return CLOSED if why is None else f"collection is closed: the task was {why}; its key shares are deleted and it takes no more reports"


class TaskState:
    """A task's context (`TaskContext`: config, party, store, pair key, channel, aggregator), the
    cache of key shares loaded from the store, and the locks of its close and queries."""

    def __init__(self, config: TaskConfig, party: int, seed: bytes, noise: bool, keys: ServerKeys, store: Store,
                 evaluator: Evaluator | None = None):
        self.ctx = ctx = TaskContext.build(config, party, seed, noise, keys, store, evaluator)
        self.config, self.party, self.store, self.pair_key = ctx.config, ctx.party, ctx.store, ctx.pair_key
        self.aggregator, self.channel = ctx.aggregator, ctx.channel  # every server-to-server message, journalled
        self.dcf = ctx.dcf  # what the reports' keys are (a verified task's also carry the check's MAC)
        self.shards: list[KeyBatch] = []
        self.sealed = False  # shards are the reconciled task's segments
        self.seq = 0
        self._nonces = hmac.new(seed, b"report check commitment nonces", hashlib.sha256).digest()  # server 1's own
        self.lock = threading.Lock()
        # the task's close and its queries one at a time: each uses every core, and a close must not
        # interleave with the task's answers; other tasks' closes and queries do not wait for it
        self.answering = threading.Lock()
        self._checking: CheckHelper | None = None  # server 1's side of a verified close
        self._preparing = threading.Lock()
        self.histograms = HistogramShare(ctx, lambda: self.refresh(self.store, self._frozen().seq))

    # --- the server-to-server protocols, as the routers call them ---------------------------------
    def close_as_leader(self, post: Callable[[str, bytes], bytes]) -> None:
        """Server 0's part of a close, after the freeze: the reconciliation, the report check of a
        verified task (else the segments and, on grids of up to GRID_SUMS_MAX, the histogram share),
        DONE. `post(path, message)` sends one message to server 1's "sync" or "verify" and returns its
        answer. Raises SyncError (server 1 deviated or failed) or Refused (server 1 refused a step)."""
        store, task_id = self.store, self.config.task_id
        leader = self.reconciliation()
        if not isinstance(leader, ReconcileLeader):
            raise Refused("server 1 is closed by server 0's close")
        leader.run(lambda m: post("sync", m))
        if self.config.verify:
            if not store.marked(task_id, Mark.VERIFIED):
                self.check_leader().run(lambda m: post("verify", m))
        else:
            self._segments_and_histogram()
        say_done(self.channel, lambda m: post("sync", m))
        self.warm_histogram()

    def answer_sync(self, raw: bytes) -> bytes:
        """Server 1's answer to a reconciliation message or DONE (Unopened, Refused, SyncError)."""
        message = self._open(raw, (*RECONCILIATION, Kind.DONE))
        with self.answering:
            restore.refuse_steps(self._not_purged())  # before the reconciliation freezes the set
            if message.kind == Kind.DONE:
                life = self._life()  # an unverified task's segments and share, made here if DONE won the lock from the
                if not self.config.verify and life.reached(ready_mark(self.config)) and not life.gone:  # builder thread
                    self._segments_and_histogram()  # (`_reconciled`); a no-op once made (review of issue 44)
                answer = finish(self.ctx, message, ready_mark(self.config))
                self.warm_histogram()
                return answer
            helper = self.reconciliation()
            if not isinstance(helper, ReconcileHelper):
                raise Refused("server 0 answers no reconciliation message")
            return helper.answer(message)

    def answer_check(self, raw: bytes) -> bytes:
        """Server 1's answer to a report-check message (Unopened, Refused, NotReady, SyncError, Restored)."""
        life = self._life()
        if restore.unfinished(life) or not self.config.verify or not life.reached(Mark.RECONCILED):
            # refused unopened: opening needs H_R, the keyed hash of the whole report set, and what depends on
            # n waits for the other server's request tag and the reconciled set (issue 42, `peer_gate`)
            restore.refuse_steps(life)
            raise Refused("the report check starts once the task is verified and reconciled")
        helper = self.helper_if_ready()
        if helper is None:
            raise NotReady("server 1 is still evaluating its reports for the check; send again shortly")
        message = self._open(raw, CHECK, helper.context)
        with self.answering:
            self._not_purged()
            return helper.answer(message)

    def _not_purged(self) -> Lifecycle:
        """Under `answering`: Unopened (answered as a forged message) once an expiry or a delete purged
        the task, deleting its key shares and its journal of answered steps. A message that got past the
        routers' purge check before the purge took the lock would otherwise be answered as a new step,
        from a round one still in memory: the once-only rule lives in the journal (security review of
        issue 24). A released task keeps its DONE, so its channel refuses every step already. Returns the
        task's lifecycle, read under the lock."""
        life = self._life()
        if life.gone:
            raise Unopened("the task's reports are deleted")
        return life

    def _life(self) -> Lifecycle:
        """The task's lifecycle (`Store.lifecycle`); TaskNotFound if its row is gone (a purge keeps it)."""
        life = self.store.lifecycle(self.config.task_id)
        if life is None:
            raise TaskNotFound(self.config.task_id)
        return life

    def _frozen(self) -> Frozen:
        """The task's fixed report set (`Store.frozen`); NotClosed while its collection is open."""
        fixed = self.store.frozen(self.config.task_id)
        if fixed is None:
            raise NotClosed("the task is not closed: the analyst closes it first (POST /tasks/{id}/close, Analyst.close)")
        return fixed

    def _open(self, raw: bytes, kinds: tuple, context: bytes = b"") -> Message:
        try:
            return self.channel.open(raw, kinds, context)
        except SyncError as exc:
            raise Unopened(str(exc)) from None

    # --- what the routers ask of the store, as one call each -----------------------------------
    def collecting(self) -> bool:
        """Whether the collection is still open (no report set fixed yet); `Restored` (409) if restored
        unfinished from a backup: never closed here, its reports would never count (`storage.restore`)."""
        life = self._life()
        restore.refuse_uploads(life)
        return life.collecting

    def status(self) -> tuple[int | None, bool, str | None]:
        """(reports, closed, restored) for GET /tasks/{id}: while collecting, this server's count of stored
        reports; once closed, the reconciled count, none between the two (a count that changed at the
        reconciliation would show what it dropped); n only where it is public; `restore.state`."""
        task_id = self.config.task_id
        life = self._life()
        closed = not life.collecting
        n = self.view()["n"] if closed else self.store.count(task_id)
        return (n if self.config.n_public else None), closed, restore.state(life)

    def check_progress(self) -> float | None:
        """A verified task's share of reports evaluated for the check (round one) on this server, until
        the check is over; None otherwise (`dpcdf close` shows it while it waits), and always where n is
        private (add/remove): round one counts whole batches of known size, so a share would give n."""
        task_id = self.config.task_id
        if not self.config.verify or not self.config.n_public or self._life().reached(Mark.VERIFIED):
            return None
        total = self.store.count(task_id)
        return min(1.0, self.store.checked_count(task_id) / total) if total else 0.0

    def view(self) -> dict:
        """n (when public) and the report-set hash, once this server is reconciled; before, nothing
        (an intermediate hash would show whether reconciliation dropped anything)."""
        task_id, verified = self.config.task_id, self.config.verify
        if not self._life().ready:  # verified if `verified`, else reconciled
            return {"n": None, "reports_hash": None, "reconciled": False}
        _, n, digest = self._frozen()
        return {"n": n if self.config.n_public else None, "reports_hash": digest, "reconciled": True,
                "rejected": self.store.rejections(task_id) if verified else None}

    def close(self, post: Callable[[str, bytes], bytes]) -> dict:
        """Server 0's POST /tasks/{id}/close under the task's `answering` lock: 403 below min_batch
        reports (TooFewReports, before anything is frozen), then the freeze and `close_as_leader`; 409
        (CloseRefused) if server 1 refused a step, 502 (PeerFailed) if it deviated or failed. Returns the
        reconciled `view`. 409 (`Restored`) for a task restored unfinished from a backup."""
        store, task_id = self.store, self.config.task_id
        with self.answering:
            life = self._life()
            restore.refuse_steps(life)  # restored unfinished: 409 before anything is frozen or sent
            if life.collecting and not store.holds(task_id, self.config.min_batch):
                raise TooFewReports(f"the task has {store.count(task_id)} reports; queries need at least {self.config.min_batch}")
            store.freeze(task_id, self.set_hash)
            try:
                self.close_as_leader(post)
            except Refused as exc:
                raise CloseRefused(f"the close cannot go on: {exc}") from None
            except SyncError as exc:  # an answer that is not server 1's, or that does not fit
                raise PeerFailed(f"server 1 did not take part in the close as the protocol says ({exc})") from None
            return self.view()

    def open_for_query(self, fixes: list[tuple[str, str, str]]) -> tuple["list[KeyBatch] | Histogram", int, str]:
        """Before a query's answer, under the task's `answering` lock: TaskGone (410) if its reports were
        deleted meanwhile (a purge holds that lock), NotClosed (409) unless the task is
        closed (reconciled, or verified), TooFewReports (403) below min_batch reports; each (kind,
        design, refusal) of `fixes` is fixed at its first query and refused (BudgetSpent, 403, `refusal`)
        with another design after.
        Marks the task answered; returns what to evaluate, n and the report-set hash."""
        store, task_id, config = self.store, self.config.task_id, self.config
        life = self._life()
        if life.gone:  # a query that passed the analyst's 410 while a purge held this lock (review of issue 43)
            raise TaskGone(gone_message(task_id, life.gone))
        if not life.ready:  # verified for a verified task, else reconciled
            raise NotClosed("the task is not closed: the analyst closes it first (POST /tasks/{id}/close, Analyst.close)")
        upto, n, digest = self._frozen()
        if n < config.min_batch:
            raise TooFewReports(f"the task has {n} reports after reconciliation; queries need at least {config.min_batch}")
        restore.refuse_new_designs(store, life, [kind for kind, _, _ in fixes])  # a restore forgot any since
        for kind, design, refusal in fixes:
            if store.fix_release(task_id, kind, design) != design:
                raise BudgetSpent(refusal)
        store.mark(task_id, Mark.ANSWERED)
        return self.source(store, upto), n, digest

    def log_query(self, kind: str, points: int) -> None:
        self.store.log_query(self.config.task_id, kind, points)

    def reconciliation(self) -> ReconcileLeader | ReconcileHelper:
        """This server's side of the reconciliation."""
        return self.ctx.reconciliation(self.forget_keys, self._reconciled)

    def check_leader(self) -> CheckLeader:
        """Server 0's side of the report check, over its round one read back for R."""
        return self.ctx.check_leader()

    def _reconciled(self) -> None:
        """Server 1 just reconciled: round one of the check, or the segments and the histogram share,
        while server 0 goes on (and makes its own: the two overlap). The segments and the share are made
        under `answering`, so server 0's DONE, and so the analyst's close, and any query wait for them."""
        if self.config.verify:
            self.prepare_in_background()
        else:
            threading.Thread(target=self._build_segments, name=f"segments-{self.config.task_id}", daemon=True).start()

    def _build_segments(self) -> None:
        with self.answering:
            if not self._life().gone:  # a delete got the lock first (review of issue 44)
                self._segments_and_histogram()

    def _segments_and_histogram(self) -> None:
        """An unverified task's close on this server, once reconciled: its key shares into their
        segments, then on grids of up to GRID_SUMS_MAX its histogram share, stored (`histograms`)."""
        self.refresh(self.store, self._frozen().seq)
        if self.histograms.answers:
            self.histograms.get()

    def helper(self) -> CheckHelper:
        """Server 1's side of the report check: its round one over the reconciled set, computed
        once (started in the background when its reconciliation ends, `prepare_in_background`)."""
        with self._preparing:
            if self._checking is None:  # R changes only by reconciliation drops, which forget it (`forget_keys`)
                self._checking = self.ctx.check_helper(self._nonces)
            return self._checking

    def prepare_in_background(self) -> None:
        threading.Thread(target=self.helper, name=f"check-{self.config.task_id}", daemon=True).start()

    def helper_if_ready(self) -> CheckHelper | None:
        """The helper if its round one is done; else None, after making sure it is being computed
        (server 0 asks again: a request never waits for a whole evaluation of the reports)."""
        if self._checking is not None:
            return self._checking
        if not self._preparing.locked():
            self.prepare_in_background()
        return None

    def source(self, store: Store, upto: int) -> "list[KeyBatch] | Histogram":
        """What a query evaluates: the task's histogram share (a verified task's, or an unverified one's
        on grids of up to GRID_SUMS_MAX points: `histograms`, made at the close), else its key shares."""
        if self.histograms.answers:
            return self.histograms.get()
        return self.refresh(store, upto)

    def warm_histogram(self) -> None:
        """In the background once the close is over: the histogram share read into memory (or, on a
        server restarted before it stored an unverified task's, made), or a larger grid's segments
        mapped, so that the first query reads them at once (issue 44)."""
        def make() -> None:
            try:
                with self.answering:  # a purge takes it: never made for a task it deletes
                    if not self._life().gone:
                        self.source(self.store, self._frozen().seq)
            except Exception as exc:  # noqa: BLE001 (a full disk): the first query makes it, or says why
                log.warning("task %s: histogram share not made ahead of its queries: %s", self.config.task_id, exc)

        if not self.config.verify:  # a verified task's is stored by its check, read at its first query
            threading.Thread(target=make, name=f"histogram-{self.config.task_id}", daemon=True).start()

    def forget_keys(self) -> None:
        """Drops the loaded key shares (after the report set changed): the next refresh reloads them."""
        with self.lock:
            self.shards, self.seq, self.sealed = [], 0, False
        with self._preparing:
            self._checking = None  # its round one was over the larger set

    def refresh(self, store: Store, upto: int) -> list[KeyBatch]:
        """The key shares of the frozen report set (reports up to sequence number `upto`). Once the
        task is reconciled: its segments, mapped from DATA/segments/<task> (checksums verified at the
        first load; written from the store's rows the first time, or when missing or corrupt), kept
        for every later query."""
        with self.lock:
            if self.sealed:
                return list(self.shards)
            if store.marked(self.config.task_id, "reconciled"):
                self.shards = list(segments.open_or_build(store, self.config.task_id, self.dcf, self.party, store.path.parent))
                self.sealed = True
                return list(self.shards)
            shares, self.seq = store.shares_since(self.config.task_id, self.seq, upto)
            if shares:
                self.shards.append(self.dcf.batch_from_keys(shares, self.party))
                if len(self.shards) > 8:
                    self.shards = [KeyBatch.concatenate(self.shards)]
            return list(self.shards)

    def set_hash(self, ids: list[bytes]) -> str:
        return self.ctx.set_hash(ids)


class Server:
    """One server's shared state (`app.state.server`); `noise=False` is the test-only switch."""

    def __init__(self, party: int, data_dir: str | Path, noise: bool = True, admin_token_file: str | Path | None = None,
                 dask: str | None = None, dask_insecure: bool = False):
        data = Path(data_dir)
        data.mkdir(parents=True, exist_ok=True)
        self.party, self.noise = party, noise
        self.probe_peer = False  # `dpcdf serve` sets it: server 0 reaches server 1 at a registration (in-process apps have no peer)
        self.admin_hash = token_hash(operator_token(data, admin_token_file))
        self.store = Store(data / "server.sqlite")
        self.keys = ServerKeys(data)
        claim_party(data, party, (r[0] for r in self.store.db.execute("SELECT config FROM tasks")), self.keys.public_hex("x25519"))
        tasks = self.store.db.execute("SELECT task_id, config, fingerprint FROM tasks").fetchall()
        self.peer_gate = PeerGate.load(party, self.keys.x25519, tasks)  # the request tags' keys, in memory (issue 42)
        # evaluation on a Dask cluster ("tls://host:8786" or "local:N"), else in-process; the noise stays here
        self.evaluator = None
        if dask is not None:
            from .dask_eval import DaskEvaluator

            self.evaluator = DaskEvaluator(dask, insecure=dask_insecure)
        self.warm = threading.Event()
        try:
            limit = int(os.environ.get(ANALYST_LIMIT_ENV, ANALYST_LIMIT))
        except ValueError:
            raise DpcdfError(f"{ANALYST_LIMIT_ENV} must be an integer") from None
        self.analyst_limit = Limiter(limit, "an analyst's closes and queries on this server")
        self._tasks: dict[str, TaskState] = {}
        self._building: dict[str, threading.Lock] = {}  # per task id: one build at a time, others unaffected
        self._tasks_lock = threading.Lock()  # guards the two dicts only, never held while a task is built
        self.checker = Checker(self)

    def close(self) -> None:
        """Disconnects from the Dask cluster (and stops a local one), if any."""
        if self.evaluator is not None:
            self.evaluator.close()
            self.evaluator = None

    def warm_up(self) -> None:
        """Compiles the kernels in the background, while reports arrive, and loads the noise sampler's (a
        first query after a start paid it: 13 ms warm from numba's disk cache, about 0.4 s cold)."""
        def run() -> None:
            backend.warm_up()
            round_one.warm_up()
            prf_noise(prf_key(bytes(32), "warm-up"), np.arange(2, dtype=np.uint64), Fraction(1))
            self.warm.set()

        threading.Thread(target=run, name="warm-up", daemon=True).start()

    def loaded(self, task_id: str) -> TaskState | None:
        """The task's state if it is loaded, without loading it."""
        return self._tasks.get(task_id)

    def unload(self, task_id: str) -> None:
        """Drops the task's loaded state (a purge of an expired or deleted task)."""
        with self._tasks_lock:
            self._tasks.pop(task_id, None)

    def task(self, task_id: str) -> TaskState:
        """The task's state, loaded from the store the first time; TaskNotFound (404) for an unknown
        task. The state is built outside the server-wide lock, under a lock of its own task id: a slow
        build holds up only requests for that task."""
        st = self._tasks.get(task_id)
        if st is not None:
            return st
        with self._tasks_lock:
            building = self._building.setdefault(task_id, threading.Lock())
        try:
            with building:
                st = self._tasks.get(task_id)
                if st is None:
                    row = self.store.task(task_id)
                    if row is None:
                        raise TaskNotFound(task_id)
                    st = TaskState(TaskConfig.from_json(row[0]), self.party, row[1], self.noise, self.keys, self.store,
                                   self.evaluator)
                    with self._tasks_lock:
                        st = self._tasks.setdefault(task_id, st)
                return st
        finally:
            with self._tasks_lock:
                if self._building.get(task_id) is building:
                    del self._building[task_id]

    def analyst_slot(self, st: TaskState):
        """One of the analyst's expensive requests in flight (a context manager): 429 with Retry-After
        beyond `analyst_limit` at once per analyst token (by its hash, across that analyst's tasks)."""
        return self.analyst_limit.slot(st.config.token_hash)

    def register(self, config: TaskConfig) -> None:
        """Stores a new task with a fresh noise seed; the same config again is a no-op, another one
        under its id 409."""
        if self.store.add_task(config.task_id, config.to_json(), config.fingerprint, secrets.token_bytes(32)) is not None:
            raise HttpError(409, f"task {config.task_id} exists with another configuration")
        self.peer_gate.add(config)

    def add_reports(self, st: TaskState, items: list[tuple[bytes, bytes]], taken: list[int] | None = None) -> int:
        """Stores checked reports (report id, opened share) in one transaction; how many were new (the same
        bytes again are stored and counted once; `taken` gets the index of each whose id holds another share,
        `Store.add_many`). 409 (CLOSED) once the collection is closed. The batches of the new reports (round one
        of a verified task, an unverified one's grid sums: `TaskContext.batched`) start now, in the background."""
        if not items:
            return 0
        task_id = st.config.task_id
        try:
            added = self.store.add_many(task_id, items, taken)
        except CollectionClosed:
            raise HttpError(409, closed_because(self, task_id)) from None
        if added and st.ctx.batched:
            self.checker.wake(task_id)
        return added
