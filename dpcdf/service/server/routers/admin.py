"""The operator's admin API (issue 24), every route behind the operator's bearer token (`deps.operator`:
401 without one, 403 with another, before the task id is looked at, so a wrong token gets the same
answer for a task that exists and one that does not):
- GET /admin/tasks: every task with its state and counts (and, on a server restored from a backup,
  whether the task was finished in it: an unfinished one takes no step again, `storage.restore`);
- POST /admin/tasks/{id}/close: closes a task as its analyst's close does (server 0; server 1 is
  closed by server 0's close, so it answers 409), for a release the analyst left open;
- DELETE /admin/tasks/{id}: deletes the task's key shares and all but its row (`storage.retention`:
  what a deleted task leaves); it answers nothing again;
- POST /admin/retention: runs the retention sweep now (what the server runs every --sweep-every s).
The operator could read the store itself; these routes give it no secret: no key share, noise seed or
token is ever in an answer."""
from __future__ import annotations

from fastapi import APIRouter, Request

from .. import peers
from ..deps import OperatorAdminDep, ServerDep
from ..errors import HttpError
from ..models import AdminTask, AdminTasks, CloseResponse, Error, PurgeResult, Responses, SweepResult, errors

router = APIRouter(prefix="/admin", tags=["admin"])
GONE: Responses = {410: {"model": Error, "description": "the task expired or was deleted: it answers nothing again"}}


@router.get("/tasks", response_model=AdminTasks, responses=errors(401, 403))
def tasks(request: Request, srv: ServerDep, _: OperatorAdminDep) -> AdminTasks:
    return AdminTasks(party=srv.party, tasks=[AdminTask(**t) for t in request.app.state.retention.tasks()])


@router.post("/tasks/{task_id}/close", response_model=CloseResponse, responses={**errors(401, 403, 404, 409, 502), **GONE})
def close(task_id: str, request: Request, srv: ServerDep, _: OperatorAdminDep) -> CloseResponse:
    """As the analyst's close (403 below the task's minimum batch, 502 if server 1 fails); 410 for an
    expired or deleted task."""
    st = srv.task(task_id)
    gone = request.app.state.retention.gone(task_id)
    if gone:
        raise HttpError(410, f"task {task_id} is {gone}: its reports are deleted")
    if srv.party == 1:
        raise HttpError(409, "server 1 is closed by server 0's close: close the task on server 0")
    return CloseResponse(party=0, **st.close(peers.poster(st)))


@router.delete("/tasks/{task_id}", response_model=PurgeResult, responses=errors(401, 403, 404))
def delete(task_id: str, request: Request, _: OperatorAdminDep) -> PurgeResult:
    return PurgeResult(**request.app.state.retention.delete(task_id)._asdict())


@router.post("/retention", response_model=SweepResult, responses=errors(401, 403))
def sweep(request: Request, _: OperatorAdminDep) -> SweepResult:
    return SweepResult(purged=[PurgeResult(**p._asdict()) for p in request.app.state.retention.sweep()])
