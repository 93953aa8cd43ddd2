"""The endpoints' dependencies: the server's shared state, a task loaded by its id, the analyst's
bearer token, and a binary body."""
from __future__ import annotations

import secrets
import tempfile
from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from ..task import token_hash
from .context import gone_message
from .errors import HttpError, TaskNotFound
from .models import Error, Responses
from .state import Server, TaskState

_bearer = HTTPBearer(auto_error=False, description="the analyst's token for the task")
_operator_bearer = HTTPBearer(auto_error=False, scheme_name="OperatorBearer", description="the server operator's token")
UNAUTHORIZED = "the analyst's bearer token is required"
THROTTLED: Responses = {429: {"model": Error, "description": "too many of this analyst's closes and queries at once",
                   "headers": {"Retry-After": {"description": "seconds to wait before sending it again",
                                               "schema": {"type": "integer"}}}}}


def server(request: Request) -> Server:
    return request.app.state.server


def task(task_id: str, srv: Annotated[Server, Depends(server)]) -> TaskState:
    """The task named in the path (404 if unknown)."""
    return srv.task(task_id)


def _operator(what: str):
    def operator(srv: Annotated[Server, Depends(server)],
                 credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_operator_bearer)]) -> None:
        """Only the operator registers tasks and reads /health/operator: 401 without a bearer token,
        403 with another one."""
        if credentials is None:
            raise HttpError(401, f"{what} needs the operator's bearer token")
        if not secrets.compare_digest(token_hash(credentials.credentials), srv.admin_hash):
            raise HttpError(403, "that is not this server's operator token")

    return operator


operator = _operator("registering a task")


def analyst_task(task_id: str, srv: Annotated[Server, Depends(server)],
                 credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]) -> TaskState:
    """The task, for its analyst only: 401 without a bearer token, with another token, or for a task
    that does not exist (the same answer, so task ids cannot be probed with a made-up token)."""
    if credentials is None:
        raise HttpError(401, UNAUTHORIZED)
    try:
        st = srv.task(task_id)
    except TaskNotFound:
        raise HttpError(401, UNAUTHORIZED) from None
    if not secrets.compare_digest(token_hash(credentials.credentials), st.config.token_hash):
        raise HttpError(401, UNAUTHORIZED)
    life = srv.store.lifecycle(task_id)
    assert life is not None  # (`srv.task` found it)
    gone = life.gone  # after the token: only the analyst learns it (issue 24)
    if gone:
        raise HttpError(410, gone_message(task_id, gone))
    return st


async def raw_body(request: Request) -> bytes:
    """The body as bytes. Its size and pace are bounded by the app's middleware (`limits.Guard`);
    while it arrives, past `Limits.memory_bytes` it waits in an unlinked 0600 file in the data
    directory (`app.state.bodies`), so a slow client holds at most that much memory."""
    memory = request.app.state.limits.memory_bytes
    chunks: list[bytes] = []
    size, spill = 0, None
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if spill is None and size > memory:
                spill = tempfile.TemporaryFile(dir=request.app.state.bodies)  # 0600, no name
                spill.writelines(chunks)
                chunks = []
            if spill is not None:
                spill.write(chunk)
            else:
                chunks.append(chunk)
        if spill is None:
            return b"".join(chunks)
        spill.seek(0)
        return spill.read()  # whole: the client no longer sets the pace
    finally:
        if spill is not None:
            spill.close()


ServerDep = Annotated[Server, Depends(server)]
TaskDep = Annotated[TaskState, Depends(task)]
AnalystTaskDep = Annotated[TaskState, Depends(analyst_task)]
OperatorDep = Annotated[None, Depends(operator)]
OperatorHealthDep = Annotated[None, Depends(_operator("/health/operator"))]
OperatorAdminDep = Annotated[None, Depends(_operator("the admin API"))]
OperatorMetricsDep = Annotated[None, Depends(_operator("/metrics"))]
RawBody = Annotated[bytes, Depends(raw_body)]
