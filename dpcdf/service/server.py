"""One of the two servers: an HTTP API over a SQLite store (FastAPI + uvicorn).

    dpcdf serve --party 0 --port 8000 --data DIR

Endpoints: GET /health, GET /hpke (this server's HPKE public key), POST /tasks (register a task),
POST /tasks/{id}/reports (one report) and /tasks/{id}/reports/batch, and for the analyst, with its
bearer token: POST /tasks/{id}/close (close the collection; relays the servers' reconciliation, see
`reconcile`), POST /tasks/{id}/query, GET /tasks/{id} (status). Handlers do their work in a thread
pool, so a large request does not hold up the others. A report is acknowledged only once its
key share is committed to disk; a malformed, truncated, wrongly sealed, foreign or duplicate report
gets a 4xx with a message and is not stored. Secrets (noise seeds, key shares, the HPKE private key)
never appear in responses or logs.
"""
from __future__ import annotations

import json
import os
import secrets
import threading
from pathlib import Path

import numpy as np
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from fss import FssError, KeyBatch

from .aggregate import Aggregator
from .wire import Report, ReportError, decode_batch, open_share
from ..errors import DpcdfError
from ..release.calibration import group_scales
from .hpke import KEMS, ServerKeys, public_key
from . import reconcile
from .store import AlreadyAnswered, CollectionClosed, Store
from .task import MAX_QUERY_POINTS, TaskConfig, token_hash

MAX_BODY = 64 << 20
TESTING_ENV = "DPCDF_TESTING"


class HttpError(Exception):
    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status, self.message = status, message


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

    def refresh(self, store, upto: int) -> list[KeyBatch]:
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


def create_app(party: int, data_dir: str | Path, noise: bool = True) -> FastAPI:
    if party not in (0, 1):
        raise DpcdfError(f"party must be 0 or 1, got {party!r}")
    if not noise and os.environ.get(TESTING_ENV) != "1":
        raise DpcdfError(f"switching noise off is a test-only setting (needs {TESTING_ENV}=1)")

    data = Path(data_dir)
    data.mkdir(parents=True, exist_ok=True)
    store = Store(data / "server.sqlite")
    keys = ServerKeys(data)
    tasks: dict[str, TaskState] = {}
    tasks_lock = threading.Lock()
    app = FastAPI(title=f"dpcdf server {party}", version="1")
    from fss import backend

    warm = threading.Event()

    def warm_up() -> None:
        backend.warm_up()
        warm.set()

    threading.Thread(target=warm_up, name="warm-up", daemon=True).start()  # compile while reports arrive

    @app.exception_handler(HttpError)
    async def _http_error(request: Request, exc: HttpError):
        return JSONResponse({"error": exc.message}, status_code=exc.status)

    @app.middleware("http")
    async def _limit_body(request: Request, call_next):
        length = request.headers.get("content-length")
        if length is not None and (not length.isdigit() or int(length) > MAX_BODY):
            return JSONResponse({"error": f"request body over {MAX_BODY} bytes"}, status_code=413)
        return await call_next(request)

    async def body(request: Request) -> bytes:
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > MAX_BODY:
                raise HttpError(413, f"request body over {MAX_BODY} bytes")
            chunks.append(chunk)
        return b"".join(chunks)

    answer_lock = threading.Lock()

    def answering(fn, *args):
        """Closes and queries one at a time (each uses every core); uploads and /health go on."""
        with answer_lock:
            return fn(*args)

    def state(task_id: str) -> TaskState:
        with tasks_lock:
            if task_id not in tasks:
                row = store.task(task_id)
                if row is None:
                    raise HttpError(404, f"unknown task {task_id}")
                tasks[task_id] = TaskState(TaskConfig.from_json(row[0]), party, row[1], noise, keys)
            return tasks[task_id]

    def authorize(request: Request, st: TaskState) -> None:
        auth = request.headers.get("authorization", "")
        if not auth.startswith("Bearer ") or not secrets.compare_digest(token_hash(auth[7:]), st.config.token_hash):
            raise HttpError(401, "the analyst's bearer token is required")

    def accept(st: TaskState, raw_reports: list[bytes]) -> tuple[list[tuple[bytes, bytes]], list[dict]]:
        """Parses and opens each report and checks that its share is a key of this task's DCF for
        this server (one vectorized decode for the whole batch; per key only to name a bad one)."""
        opened, rejected = [], []
        fp, kem = st.config.fingerprint, st.config.kem
        private = keys.private(kem)
        for i, raw in enumerate(raw_reports):
            try:
                report = Report.from_bytes(raw)
                opened.append((i, report.report_id, open_share(report, party, private, fp, kem)))
            except ReportError as exc:
                rejected.append({"index": i, "error": str(exc)})
        try:
            st.dcf.batch_from_keys([o[2] for o in opened], party)
            valid = {o[0] for o in opened}
        except FssError:  # find the bad ones
            valid = set()
            for o in opened:
                try:
                    st.dcf.key_from_bytes(o[2], party=party)
                    valid.add(o[0])
                except FssError:
                    pass
        good = []
        for i, rid, share in opened:
            if i in valid:
                good.append((rid, share))
            else:
                rejected.append({"index": i, "error": "the share is not a key of this task's function for this server"})
        rejected.sort(key=lambda r: r["index"])
        return good, rejected

    @app.get("/health")
    def health():
        return {"party": party, "status": "ok", "warm": warm.is_set()}

    @app.get("/hpke")
    def hpke():
        return {"kdf": "HKDF-SHA256", "aead": "AES-128-GCM", "keys": {kem: keys.public_hex(kem) for kem in KEMS}}

    def _create_task(request: Request, raw: bytes):
        try:
            config = TaskConfig.from_json(raw)
        except DpcdfError as exc:
            raise HttpError(400, str(exc)) from None
        if config.hpke_keys[party] != keys.public_hex(config.kem):
            raise HttpError(400, f"the task does not name this server's {config.kem} HPKE key as server {party}'s")
        try:  # the other server's key: clients seal to it, and the servers' shared key comes from it
            public_key(config.kem, config.hpke_keys[1 - party])
            pair_key(config, party, keys)
        except (DpcdfError, ValueError) as exc:
            raise HttpError(400, f"server {1 - party}'s HPKE key in the task is not a {config.kem} key: {exc}") from None
        conflict = store.add_task(config.task_id, config.to_json(), config.fingerprint, secrets.token_bytes(32))
        if conflict is not None:
            raise HttpError(409, f"task {config.task_id} exists with another configuration")
        return {"task_id": config.task_id, "fingerprint": config.fingerprint.hex()}

    @app.post("/tasks", status_code=201)
    async def create_task(request: Request):
        return await run_in_threadpool(_create_task, request, await body(request))

    def _upload(task_id: str, request: Request, raw: bytes):
        st = state(task_id)
        good, rejected = accept(st, [raw])
        if rejected:
            raise HttpError(400, rejected[0]["error"])
        try:
            added = store.add_reports(task_id, good)[0]
        except CollectionClosed:
            raise HttpError(409, "collection is closed: the analyst has closed the task") from None
        if not added:
            raise HttpError(409, "duplicate report id: already stored and counted once")
        return {"accepted": 1}

    @app.post("/tasks/{task_id}/reports", status_code=201)
    async def upload(task_id: str, request: Request):
        return await run_in_threadpool(_upload, task_id, request, await body(request))

    def _upload_batch(task_id: str, request: Request, raw: bytes):
        st = state(task_id)
        try:
            raw = decode_batch(raw)
        except ReportError as exc:
            raise HttpError(400, str(exc)) from None
        good, rejected = accept(st, raw)
        try:
            added = store.add_many(task_id, good) if good else 0
        except CollectionClosed:
            raise HttpError(409, "collection is closed: the analyst has closed the task") from None
        return {"accepted": added, "duplicates": len(good) - added, "rejected": rejected}

    @app.post("/tasks/{task_id}/reports/batch")
    async def upload_batch(task_id: str, request: Request):
        return await run_in_threadpool(_upload_batch, task_id, request, await body(request))

    @app.get("/tasks/{task_id}")
    def status(task_id: str, request: Request):
        st = state(task_id)
        authorize(request, st)
        frozen = store.frozen(task_id)
        n = frozen[1] if frozen else store.count(task_id)
        return {"task_id": task_id, "reports": n if st.config.n_public else None, "closed": frozen is not None,
                "min_batch": st.config.min_batch}

    def json_body(raw: bytes) -> object:
        try:
            return json.loads(raw or b"{}")
        except (ValueError, RecursionError):
            raise HttpError(400, "the body must be JSON") from None

    def freeze(st: TaskState) -> tuple[int, int, str]:
        task_id = st.config.task_id
        if store.frozen(task_id) is None and store.count(task_id) < st.config.min_batch:
            raise HttpError(403, f"the task has {store.count(task_id)} reports; queries need at least {st.config.min_batch}")
        return store.freeze(task_id, st.set_hash)

    def exclude(st: TaskState, ids) -> tuple[int, int, str]:
        try:
            return store.exclude(st.config.task_id, sorted(ids), st.set_hash)
        except AlreadyAnswered:
            raise HttpError(409, "the servers' report sets differ and this server has already answered: "
                                 "the task cannot be reconciled") from None

    def _close(task_id: str, request: Request, raw: bytes):
        """The close and the four reconciliation messages of `reconcile`, relayed by the analyst:
        server 0 without a message sends 1; server 1 answers 1 with 2 (or refuses: more differences
        than message 2 can list); server 0 answers 2 with 3; server 1 takes 3. Each server drops
        its one-sided reports on the way, and is reconciled (answers queries, shows its report-set
        hash) after its last message."""
        st = state(task_id)
        authorize(request, st)
        msg = json_body(raw)
        sync = msg.get("sync") if isinstance(msg, dict) else None
        key, fp = st.pair_key, st.config.fingerprint
        freeze(st)
        ids = store.frozen_ids(task_id)
        drop: set[bytes] = set()
        reply, done = None, False
        try:
            if sync is None:
                if party != 0:
                    raise HttpError(400, "server 1 closes with server 0's sync message")
                reply = reconcile.seal(key, 1, fp, reconcile.bucket_digests(key, ids))
            elif party == 1:
                rnd, payload = reconcile.open_sealed(key, fp, sync, (1, 3))
                if rnd == 1:
                    differ = reconcile.differing(reconcile.bucket_digests(key, ids), payload)
                    grouped = reconcile.members(ids, reconcile.buckets(key, ids), differ)
                    reply = reconcile.seal(key, 2, fp, reconcile.bitmap(differ) + reconcile.id_table(differ, grouped))
                else:
                    drop, done = set(reconcile.read_id_list(payload)) & set(ids), True
            else:
                _, payload = reconcile.open_sealed(key, fp, sync, (2,))
                differ = reconcile.from_bitmap(payload[:reconcile.BUCKETS // 8])
                theirs = reconcile.read_id_table(payload[reconcile.BUCKETS // 8:], differ)
                grouped = reconcile.members(ids, reconcile.buckets(key, ids), differ)
                they_drop = set()
                for b in differ.tolist():
                    drop |= set(grouped[b]) - theirs[b]
                    they_drop |= theirs[b] - set(grouped[b])
                reply, done = reconcile.seal(key, 3, fp, reconcile.id_list(sorted(they_drop))), True
        except reconcile.SyncError as exc:
            raise HttpError(400, str(exc)) from None
        except reconcile.TooManyDifferences as exc:
            raise HttpError(409, str(exc)) from None
        if drop:
            exclude(st, drop)
        if done:
            store.mark(task_id, "reconciled")
        return {"party": party, "closed": True, **reconciled_view(st), "sync": reply}

    def reconciled_view(st: TaskState) -> dict:
        """n (when public) and the report-set hash, once this server is reconciled; before, nothing
        (an intermediate hash would show whether reconciliation dropped anything)."""
        if not store.marked(st.config.task_id, "reconciled"):
            return {"n": None, "reports_hash": None, "reconciled": False}
        _, n, digest = store.frozen(st.config.task_id)
        return {"n": n if st.config.n_public else None, "reports_hash": digest, "reconciled": True}

    @app.post("/tasks/{task_id}/close")
    async def close(task_id: str, request: Request):
        return await run_in_threadpool(answering, _close, task_id, request, await body(request))

    def parse_query(st: TaskState, q: object) -> tuple[str, object]:
        """The query's kind and argument, checked before anything is frozen or answered."""
        size = st.aggregator.mechanism.size
        kind = q.get("kind") if isinstance(q, dict) else None
        if st.config.payload == "calibration" and kind == "groups":
            edges = q.get("edges")
            if (not isinstance(edges, list) or not all(type(e) is int and 0 <= e < size - 1 for e in edges)
                    or any(b < a for a, b in zip(edges, edges[1:]))):
                raise HttpError(400, f"edges must be non-decreasing grid indices in [0, {size - 1})")
            return kind, edges
        if kind == "prefix":
            idx = q.get("indices")
            if not isinstance(idx, list) or not idx or not all(type(i) is int and 0 <= i < size for i in idx):
                raise HttpError(400, f"indices must be a non-empty list of grid indices in [0, {size})")
            if len(idx) > MAX_QUERY_POINTS:
                raise HttpError(400, f"at most {MAX_QUERY_POINTS} indices per query")
            return kind, idx
        if kind == "nodes":
            level = q.get("level")
            if st.config.mechanism != "tree" or type(level) is not int or level not in st.aggregator.mechanism.released_levels():
                raise HttpError(400, "node queries need the tree mechanism and a released level")
            return kind, level
        raise HttpError(400, "kind must be 'prefix', 'nodes' or (calibration tasks) 'groups'")

    def _query(task_id: str, request: Request, raw: bytes):
        st = state(task_id)
        authorize(request, st)
        kind, arg = parse_query(st, json_body(raw))
        if not store.marked(task_id, "reconciled"):
            raise HttpError(409, "the task is not closed: the analyst closes it first (POST /tasks/{id}/close, Analyst.close)")
        upto, n, digest = store.frozen(task_id)
        if n < st.config.min_batch:
            raise HttpError(403, f"the task has {n} reports after reconciliation; queries need at least {st.config.min_batch}")
        if kind == "groups" and store.fix_release(task_id, "groups", json.dumps(arg)) != json.dumps(arg):
            raise HttpError(403, "this task's groups are already released with other boundaries: the budget is spent")
        store.mark(task_id, "answered")
        shards = st.refresh(store, upto)
        if kind == "groups":
            shares = st.aggregator.group_shares(shards, np.array(arg, np.int64), group_scales(st.config.epsilon, st.config.split))
        elif kind == "prefix":
            shares = st.aggregator.prefix_shares(shards, np.array(arg, np.int64))
        else:
            shares = st.aggregator.node_shares(shards, arg)
        if st.config.payload == "calibration" and kind != "groups":
            shares = shares[:, 0]  # only the ECDF of the probabilities: the other elements go out as group sums
        store.log_query(task_id, kind, int(shares.size))
        width = 1 if shares.ndim == 1 else shares.shape[1]
        return {"party": party, "n": n if st.config.n_public else None, "reports_hash": digest, "width": width,
                "shares": [str(int(v)) for v in shares.reshape(-1)]}

    @app.post("/tasks/{task_id}/query")
    async def query(task_id: str, request: Request):
        return await run_in_threadpool(answering, _query, task_id, request, await body(request))

    return app


def serve(party: int, port: int, data_dir: str, host: str = "127.0.0.1", noise: bool = True) -> None:
    import uvicorn

    uvicorn.run(create_app(party, data_dir, noise), host=host, port=port, log_level="warning")
