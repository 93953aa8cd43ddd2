"""POST /tasks (register, the operator's: `registration`); for the analyst GET /tasks/{id} (status)
and POST /tasks/{id}/close (close the collection, reconcile the servers, and for a verified task check
every report). The servers' messages to each other are `routers.exchange`'s. The protocols themselves
live in `dpcdf.service.protocols` (Leader/Helper objects over one Channel per task), called by the
task's state (`state`, `peers`): these handlers only parse, call and answer."""
from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

from .. import peers, registration
from ..deps import THROTTLED, AnalystTaskDep, OperatorDep, RawBody, ServerDep
from ..errors import HttpError
from ..models import CloseResponse, TaskRegistered, TaskStatus, errors

router = APIRouter(prefix="/tasks", tags=["tasks"])

_CONFIG_BODY = {"requestBody": {"required": True, "content": {"application/json": {"schema": {"$ref": "#/components/schemas/TaskSpec"}}}}}


@router.post("", status_code=201, response_model=TaskRegistered, responses=errors(400, 401, 403, 409, 502),
             openapi_extra=_CONFIG_BODY)
def register(request: Request, srv: ServerDep, _: OperatorDep, raw: RawBody) -> TaskRegistered:
    """Registers a task (the operator only): the config must name this server's HPKE key as its own
    and a valid key for the other server; on server 0, server 1 must answer at its URL with that key
    (`peers.probe`: 502 if it cannot be reached, its certificate included). The same config again is a
    no-op; another one under its id is 409."""
    config = registration.register(srv, raw, request.app.state.retention)
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
    extra: dict[str, Any] = {"restored": restored} if restored is not None else {}  # left unset: not in the answer
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
