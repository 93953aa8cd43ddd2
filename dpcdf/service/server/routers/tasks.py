"""POST /tasks (register); for the analyst GET /tasks/{id} (status) and POST /tasks/{id}/close (close
the collection, reconcile the servers, and for a verified task check every report); between the
servers POST /tasks/{id}/sync and /tasks/{id}/verify. The protocols themselves live in
`dpcdf.service.protocols` (Leader/Helper objects over one Channel per task): these handlers only
parse, authenticate and call them."""
from __future__ import annotations

import secrets
import time

from fastapi import APIRouter, Response

from ....errors import DpcdfError
from ...hpke import public_key
from ...http import ServerError, fetch
from ...protocols.channel import NotReady, Refused, Unopened
from ...protocols.reconciliation.maths import SyncError
from ...task import TaskConfig
from ..deps import THROTTLED, AnalystTaskDep, OperatorDep, RawBody, ServerDep
from ..errors import HttpError
from ..models import CloseResponse, TaskRegistered, TaskStatus, errors
from ..state import Server, TaskState, pair_key

router = APIRouter(prefix="/tasks", tags=["tasks"])

OCTETS = "application/octet-stream"
PEER_TIMEOUT = 60  # seconds per socket operation with server 1 (its part for 10^6 reports: a few seconds)
CHECK_WAIT = 1800  # seconds server 0 waits for server 1's evaluation of its reports (10^6 at 2^10: about a minute)
_SEALED = {"type": "string", "format": "binary", "description": "a reconciliation message, AES-GCM under the servers' key"}
_OCTET_BODY = {"requestBody": {"required": True, "content": {OCTETS: {"schema": _SEALED}}}}
_OCTET_ANSWER = {"description": "server 1's reply (empty after the last message)", "content": {OCTETS: {"schema": _SEALED}}}
_CONFIG_BODY = {"requestBody": {"required": True, "content": {"application/json": {"schema": {"$ref": "#/components/schemas/TaskSpec"}}}}}


@router.post("", status_code=201, response_model=TaskRegistered, responses=errors(400, 401, 403, 409),
             openapi_extra=_CONFIG_BODY)
def register(srv: ServerDep, _: OperatorDep, raw: RawBody) -> TaskRegistered:
    """Registers a task (the operator only): the config must name this server's HPKE key as its own
    and a valid key for the other server. The same config again is a no-op; another one under its id
    is 409."""
    party = srv.party
    try:
        config = TaskConfig.from_json(raw)
    except DpcdfError as exc:
        raise HttpError(400, str(exc)) from None
    if config.hpke_keys[party] != srv.keys.public_hex(config.kem):
        raise HttpError(400, f"the task does not name this server's {config.kem} HPKE key as server {party}'s")
    try:  # the other server's key: clients seal to it, and the servers' shared key comes from it
        public_key(config.kem, config.hpke_keys[1 - party])
        pair_key(config, party, srv.keys)
    except (DpcdfError, ValueError) as exc:
        raise HttpError(400, f"server {1 - party}'s HPKE key in the task is not a {config.kem} key: {exc}") from None
    if srv.store.add_task(config.task_id, config.to_json(), config.fingerprint, secrets.token_bytes(32)) is not None:
        raise HttpError(409, f"task {config.task_id} exists with another configuration")
    return TaskRegistered(task_id=config.task_id, fingerprint=config.fingerprint.hex())


@router.get("/{task_id}", response_model=TaskStatus, responses=errors(401))
def status(task_id: str, srv: ServerDep, st: AnalystTaskDep) -> TaskStatus:
    """While collecting, this server's count of stored reports (under substitution; reports that
    reached this server only are in it until the close); once closed, the reconciled count, none
    between the two (a count that changed at the reconciliation would show what it dropped)."""
    frozen = srv.store.frozen(task_id)
    n = reconciled_view(srv, st)["n"] if frozen else srv.store.count(task_id)
    return TaskStatus(task_id=task_id, reports=n if st.config.n_public else None, closed=frozen is not None,
                      min_batch=st.config.min_batch)


@router.post("/{task_id}/close", response_model=CloseResponse, responses={**errors(401, 403, 404, 409, 502), **THROTTLED})
def close(srv: ServerDep, st: AnalystTaskDep) -> CloseResponse:
    """Closes the collection and reconciles the two servers' report sets (`protocols.reconciliation`). On server 0
    (the leader) this runs the whole exchange with server 1 directly; server 1 answers 409 until
    server 0 has done so, then the same view. Idempotent: a close interrupted by a crash of either
    server is finished by calling it again. A task's close and its queries run one at a time; other
    tasks' do not wait for them. Limit (on server 0, where the close works): like a query, one of the
    analyst token's at most 2 closes and queries in flight on this server (DPCDF_ANALYST_CONCURRENCY);
    beyond, 429 {"error": ...} with a Retry-After header (seconds)."""
    task_id, store = st.config.task_id, srv.store
    if srv.party == 1:
        view = reconciled_view(srv, st)
        if not view["reconciled"]:
            raise HttpError(409, "server 1 is reconciled by server 0's close: close server 0 first")
        return CloseResponse(party=1, **view)
    with srv.analyst_slot(st), st.answering:
        if store.frozen(task_id) is None and store.count(task_id) < st.config.min_batch:
            raise HttpError(403, f"the task has {store.count(task_id)} reports; queries need at least {st.config.min_batch}")
        store.freeze(task_id, st.set_hash)
        base = f"{st.config.servers[1]}/tasks/{task_id}"
        try:
            st.close_as_leader(lambda path, m: _peer(f"{base}/{path}", m, patient=path == "verify"))
        except Refused as exc:
            raise HttpError(409, f"the close cannot go on: {exc}") from None
        except SyncError as exc:  # an answer that is not server 1's, or that does not fit
            raise HttpError(502, f"server 1 did not take part in the close as the protocol says ({exc})") from None
        return CloseResponse(party=0, **reconciled_view(srv, st))


@router.post("/{task_id}/verify", response_class=Response, responses={**errors(400, 409, 503), 200: _OCTET_ANSWER},
             openapi_extra=_OCTET_BODY)
def verify_reports(task_id: str, srv: ServerDep, raw: RawBody) -> Response:
    """Server 0's report-check messages to server 1 (binary, `protocols.check.exchange`), for verified
    tasks once both servers are reconciled. No token: like /sync, a message counts only
    if it opens under the servers' shared key, for this task, step and report set. Each step is
    answered once (409 for other content at an answered step, or for anything once the task is done)."""
    return _from_peer(lambda: _peer_task(srv, task_id, "report-check").answer_check(raw))


@router.post("/{task_id}/sync", response_class=Response, responses={**errors(400, 409), 200: _OCTET_ANSWER},
             openapi_extra=_OCTET_BODY)
def sync(task_id: str, srv: ServerDep, raw: RawBody) -> Response:
    """Server 0's reconciliation messages to server 1 (binary, `protocols.reconciliation.exchange`), and its
    DONE at the end of every close. No token: a message counts only if it opens under the key the two
    servers share for this task (AES-GCM, bound to the kind, the chunk and the task), which no client
    or analyst can compute. The first message closes the collection here. Each step is answered once
    (409 for other content at an answered step, for a new step once reconciled, or for anything once
    the task is done)."""
    return _from_peer(lambda: _peer_task(srv, task_id, "reconciliation").answer_sync(raw))


FORGED = "the message is not the other server's for this task"


def _from_peer(answer) -> Response:
    """Server 1's answer to one message from server 0, its refusals as HTTP statuses."""
    try:
        return Response(answer(), media_type=OCTETS)
    except Unopened:
        raise HttpError(400, FORGED) from None
    except NotReady as exc:
        raise HttpError(503, str(exc), {"Retry-After": "1"}) from None
    except Refused as exc:
        raise HttpError(409, str(exc)) from None
    except SyncError as exc:
        raise HttpError(400, str(exc)) from None


def _peer_task(srv: Server, task_id: str, what: str) -> TaskState:
    """The task a server-to-server message names, on server 1 only; an unknown task gets the answer
    a forged message gets (no probing of task ids here)."""
    if srv.party != 1:
        raise HttpError(400, f"only server 1 takes {what} messages")
    try:
        return srv.task(task_id)
    except HttpError:
        raise HttpError(400, FORGED) from None


def _peer(url: str, message: bytes, patient: bool = False) -> bytes:
    """One message to server 1 and its answer; 502 if it does not come (PEER_TIMEOUT per socket
    operation, so a peer that accepts but never answers holds the close for a minute, not forever),
    `Refused` if server 1 refuses it (409). `patient`: a 503 (server 1 still evaluating its reports
    for the check) is sent again each second for up to CHECK_WAIT seconds."""
    deadline = time.monotonic() + CHECK_WAIT
    while True:
        try:
            return fetch("POST", url, message, content_type=OCTETS, timeout=PEER_TIMEOUT)
        except ServerError as exc:
            if patient and exc.status == 503 and time.monotonic() < deadline:
                time.sleep(1)
                continue
            if exc.status == 409:
                raise Refused(f"server 1 refused: {exc}") from None
            raise HttpError(502, f"server 1 did not take part in the close ({exc}); close again to retry") from None


def reconciled_view(srv: Server, st: TaskState) -> dict:
    """n (when public) and the report-set hash, once this server is reconciled; before, nothing
    (an intermediate hash would show whether reconciliation dropped anything)."""
    task_id, verified = st.config.task_id, st.config.verify
    if not srv.store.marked(task_id, "verified" if verified else "reconciled"):
        return {"n": None, "reports_hash": None, "reconciled": False}
    _, n, digest = srv.store.frozen(task_id)
    return {"n": n if st.config.n_public else None, "reports_hash": digest, "reconciled": True,
            "rejected": srv.store.rejections(task_id) if verified else None}
