"""POST /tasks (register); for the analyst GET /tasks/{id} (status) and POST /tasks/{id}/close (close
the collection, reconcile the servers, and for a verified task check every report); between the
servers POST /tasks/{id}/sync and /tasks/{id}/verify. The protocols themselves live in
`dpcdf.service.protocols` (Leader/Helper objects over one Channel per task), called by the task's
state (`state`, `peers`): these handlers only parse, call and answer."""
from __future__ import annotations

from fastapi import APIRouter, Request, Response

from ....errors import DpcdfError
from ...hpke import public_key
from ...task import MAX_VERIFIED_GRID, TaskConfig
from .. import peers
from ..deps import THROTTLED, AnalystTaskDep, OperatorDep, RawBody, ServerDep
from ..errors import HttpError
from ..models import CloseResponse, Error, TaskRegistered, TaskStatus, errors
from ..state import pair_key

router = APIRouter(prefix="/tasks", tags=["tasks"])

OCTETS = peers.OCTETS
_SEALED = {"type": "string", "format": "binary", "description": "a reconciliation message, AES-GCM under the servers' key"}
_OCTET_BODY = {"requestBody": {"required": True, "content": {OCTETS: {"schema": _SEALED}}}}
_OCTET_ANSWER = {"description": "server 1's reply (empty after the last message)", "content": {OCTETS: {"schema": _SEALED}}}
_PEER_REFUSALS = {401: {"model": Error, "description": "no request tag (Dpcdf-Peer header) or no Content-Length"},
                  403: {"model": Error, "description": "not the other server's request tag for this task and message"}}
_CONFIG_BODY = {"requestBody": {"required": True, "content": {"application/json": {"schema": {"$ref": "#/components/schemas/TaskSpec"}}}}}


@router.post("", status_code=201, response_model=TaskRegistered, responses=errors(400, 401, 403, 409, 502),
             openapi_extra=_CONFIG_BODY)
def register(request: Request, srv: ServerDep, _: OperatorDep, raw: RawBody) -> TaskRegistered:
    """Registers a task (the operator only): the config must name this server's HPKE key as its own
    and a valid key for the other server; on server 0, server 1 must answer at its URL with that key
    (`peers.probe`: 502 if it cannot be reached, its certificate included). The same config again is a
    no-op; another one under its id is 409."""
    party = srv.party
    try:
        config = TaskConfig.from_json(raw)
    except DpcdfError as exc:
        raise HttpError(400, str(exc)) from None
    if config.hpke_keys[party] != srv.keys.public_hex(config.kem):
        swapped = config.hpke_keys[1 - party] == srv.keys.public_hex(config.kem)
        raise HttpError(400, f"the task does not name this server's {config.kem} HPKE key as server {party}'s"
                        + (f" (it names this server as server {1 - party}: list the servers in party order, server 0's "
                           "URL first)" if swapped else ""))
    try:  # the other server's key: clients seal to it, and the servers' shared key comes from it
        public_key(config.kem, config.hpke_keys[1 - party])
        pair_key(config, party, srv.keys)
    except (DpcdfError, ValueError) as exc:
        raise HttpError(400, f"server {1 - party}'s HPKE key in the task is not a {config.kem} key: {exc}") from None
    if config.verify and config.make_grid().size > MAX_VERIFIED_GRID and getattr(srv.evaluator, "round_one", None) is None:
        raise HttpError(400, f"a verified task of more than {MAX_VERIFIED_GRID} grid points needs a server with a "
                             "Dask cluster reached over TLS (dpcdf serve --dask local:N or tls://...): this one has "
                             "none; use verify=false")
    if party == 0 and srv.probe_peer:  # the direction of every server-to-server message: checked now, not at the close
        peers.probe(config)
    srv.register(config)
    gone = request.app.state.retention.gone(config.task_id)  # issue 24: its id stays taken, its seed gone
    if gone:
        raise HttpError(409, f"task {config.task_id} is {gone}: register a new task (a new id) instead")
    return TaskRegistered(task_id=config.task_id, fingerprint=config.fingerprint.hex())


@router.get("/{task_id}", response_model=TaskStatus, response_model_exclude_unset=True, responses=errors(401))
def status(task_id: str, srv: ServerDep, st: AnalystTaskDep) -> TaskStatus:
    """While collecting, this server's count of stored reports (under substitution; reports that
    reached this server only are in it until the close); once closed, the reconciled count, none
    between the two (a count that changed at the reconciliation would show what it dropped).
    `restored` only on a server restored from a backup: a live server's answer is what it was (None
    reports stay: exclude_unset, not exclude_none). `checked`: a verified task's check progress on this
    server until it is over, where n is public (under add/remove the batches it counts would give n)."""
    n, closed, restored = st.status()
    extra = {"restored": restored} if restored is not None else {}  # left unset: not in the answer
    checked = st.check_progress()
    if checked is not None:
        extra["checked"] = checked
    return TaskStatus(task_id=task_id, reports=n, closed=closed, min_batch=st.config.min_batch, **extra)


@router.post("/{task_id}/close", response_model=CloseResponse, responses={**errors(401, 403, 404, 409, 502), **THROTTLED})
def close(srv: ServerDep, st: AnalystTaskDep) -> CloseResponse:
    """Closes the collection and reconciles the two servers' report sets (`protocols.reconciliation`). On server 0
    (the leader) this runs the whole exchange with server 1 directly; server 1 answers 409 until
    server 0 has done so, then the same view. Idempotent: a close interrupted by a crash of either
    server is finished by calling it again. A task's close and its queries run one at a time; other
    tasks' do not wait for them. Limit (on server 0, where the close works): like a query, one of the
    analyst token's at most 2 closes and queries in flight on this server (DPCDF_ANALYST_CONCURRENCY);
    beyond, 429 {"error": ...} with a Retry-After header (seconds)."""
    if srv.party == 1:
        view = st.view()
        if not view["reconciled"]:
            raise HttpError(409, "server 1 is reconciled by server 0's close: close server 0 first")
        return CloseResponse(party=1, **view)
    with srv.analyst_slot(st):
        return CloseResponse(party=0, **st.close(peers.poster(st)))


@router.post("/{task_id}/verify", response_class=Response, responses={**errors(400, 409, 503), **_PEER_REFUSALS, 200: _OCTET_ANSWER},
             openapi_extra=_OCTET_BODY)
def verify_reports(task_id: str, request: Request, srv: ServerDep, raw: RawBody) -> Response:
    """Server 0's report-check messages to server 1 (binary, `protocols.check.exchange`), for verified
    tasks once both servers are reconciled. Like /sync: the other server's request tag in the
    Dpcdf-Peer header (401 without, 403 wrong, before the body is read: `peer_gate`), then a message
    counts only if it opens under the servers' shared key, for this task, step and report set. 409 for
    an unverified task (before the body is read) or before both servers are reconciled. Each step is
    answered once (409 for other content at an answered step, or for anything once the task is done)."""
    return Response(peers.answer(srv, request, task_id, "report-check", raw), media_type=OCTETS)


@router.post("/{task_id}/sync", response_class=Response, responses={**errors(400, 409), **_PEER_REFUSALS, 200: _OCTET_ANSWER},
             openapi_extra=_OCTET_BODY)
def sync(task_id: str, request: Request, srv: ServerDep, raw: RawBody) -> Response:
    """Server 0's reconciliation messages to server 1 (binary, `protocols.reconciliation.exchange`), and its
    DONE at the end of every close. No token, but the other server's request tag in the Dpcdf-Peer
    header: an HMAC under the key the two servers share for this task over the path, the message's
    head and length, checked before the body is read (401 without, 403 wrong, both charged to the
    sender's address: `peer_gate`); then a message counts only if it opens under that key (AES-GCM,
    bound to the kind, the chunk and the task), which no client or analyst can compute. The first
    message closes the collection here. Each step is answered once (409 for other content at an
    answered step, for a new step once reconciled, or for anything once the task is done)."""
    return Response(peers.answer(srv, request, task_id, "reconciliation", raw), media_type=OCTETS)
