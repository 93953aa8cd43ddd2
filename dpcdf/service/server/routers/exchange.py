"""Between the servers: POST /tasks/{id}/sync (reconciliation) and /tasks/{id}/verify (the report check),
server 0's binary messages to server 1 during a close. The protocols live in `dpcdf.service.protocols`;
`peers.answer` checks each message and answers it from the task's state: these handlers only call it."""
from __future__ import annotations

from fastapi import APIRouter, Request, Response

from .. import peers
from ..deps import RawBody, ServerDep
from ..models import Error, Responses, errors

router = APIRouter(prefix="/tasks", tags=["tasks"])

OCTETS = peers.OCTETS
_SEALED = {"type": "string", "format": "binary", "description": "a reconciliation message, AES-GCM under the servers' key"}
_OCTET_BODY = {"requestBody": {"required": True, "content": {OCTETS: {"schema": _SEALED}}}}
_OCTET_ANSWER = {"description": "server 1's reply (empty after the last message)", "content": {OCTETS: {"schema": _SEALED}}}
_PEER_REFUSALS: Responses = {401: {"model": Error, "description": "no request tag (Dpcdf-Peer header) or no Content-Length"},
                  403: {"model": Error, "description": "not the other server's request tag for this task and message"}}


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
