"""POST /tasks/{id}/reports (one report) and /tasks/{id}/reports/batch (`wire.encode_batch`): binary
bodies, taken in by `ingest` (what is refused, in which order, what a refusal costs its sender, and when
a report is acknowledged: its docstring); these handlers only map its answers to HTTP."""
from __future__ import annotations

from fastapi import APIRouter, Request

from .. import ingest
from ..deps import RawBody, ServerDep
from ..limits import client_address
from ..models import Accepted, BatchAccepted, Error, Rejected, Responses, errors

router = APIRouter(prefix="/tasks/{task_id}/reports", tags=["reports"])

RETRY_STATUS: Responses = {429: {"model": Error, "description": "this address sent too many reports that "
                      "did not open: send again after Retry-After seconds",
                      "headers": {"Retry-After": {"description": "seconds", "schema": {"type": "integer"}}}}}


def _binary(what: str) -> dict:
    schema = {"type": "string", "format": "binary", "description": what}
    return {"requestBody": {"required": True, "content": {"application/octet-stream": {"schema": schema}}}}


@router.post("", status_code=201, response_model=Accepted, responses={**errors(400, 408, 409, 413), **RETRY_STATUS},
             openapi_extra=_binary("one report (`wire.Report.to_bytes`)"))
def upload(task_id: str, request: Request, srv: ServerDep, raw: RawBody) -> Accepted:
    state = request.app.state
    ingest.take_one(srv, task_id, raw, client_address(request.scope), state.failures, state.metrics)
    return Accepted()


@router.post("/batch", response_model=BatchAccepted, responses={**errors(400, 408, 409, 413), **RETRY_STATUS},
             openapi_extra=_binary("reports in one batch (`wire.encode_batch`)"))
def upload_batch(task_id: str, request: Request, srv: ServerDep, raw: RawBody) -> BatchAccepted:
    """Stores the good reports of the batch; names each refused one by its index (at most
    REJECTS_PER_BATCH of them: a batch with more is refused whole), and each whose id this server
    holds with another share (`conflicts`, also in `rejected`: an earlier client reads them as refused)."""
    state = request.app.state
    out = ingest.take_batch(srv, task_id, raw, client_address(request.scope), state.failures, state.metrics)
    return BatchAccepted(accepted=out.accepted, duplicates=out.duplicates, conflicts=out.conflicts,
                         rejected=[Rejected(index=r.index, error=r.error) for r in out.rejected])
