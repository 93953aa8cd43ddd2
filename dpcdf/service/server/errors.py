"""The server's refusals: `HttpError` (a status and a message), the domain errors of the layers below
the routers (`STATUS`: each class's status), and the handlers that turn them, a request that fails
validation, and Starlette's own errors (unknown route, unreadable body) into one JSON shape,
{"error": message}, that clients read (`dpcdf.service.http`)."""
from __future__ import annotations

import json
import logging
from typing import Any, Awaitable, Callable, Mapping

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from ...errors import DpcdfError
from ..storage.restore import Restored
from ..wire import TAKEN
from .answers import QueryRefused
from .context import BudgetSpent, CloseRefused, NotClosed, PeerFailed, TaskGone, TaskNotFound, TooFewReports

NOT_JSON = "the body must be JSON"


class HttpError(DpcdfError):
    """A request the server refuses, with the HTTP status (and any headers) to answer."""

    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.message, self.headers = status, message, headers


class ReportIdTaken(HttpError):
    """409: this server holds another share under the upload's report id (issue 42). Someone who learned
    the id first (a deviating other server, a logging proxy) stored theirs: the upload is not stored, and
    its sender must hear so (never "duplicate", which acknowledges), since the report will not count."""

    def __init__(self):
        super().__init__(409, f"{TAKEN}: this server holds another share under this id; this report is not stored")


def problem(error: dict) -> str:
    """One validation error as a sentence: a validator's own message as it is, others with the
    field they concern."""
    if error["type"] == "json_invalid":
        return NOT_JSON
    if error["type"] == "value_error":
        return str(error["ctx"]["error"])
    where = ".".join(str(part) for part in error["loc"][1:])  # loc[0] is 'body', 'path', ...
    return f"{where}: {error['msg']}" if where else error["msg"]


STATUS: dict[type[DpcdfError], int] = {QueryRefused: 400, TaskNotFound: 404, NotClosed: 409, TooFewReports: 403,
                                       BudgetSpent: 403, CloseRefused: 409, PeerFailed: 502, Restored: 409, TaskGone: 410}
"""The domain errors of the state and protocol layer, each answered with its status (the most
specific class listed wins)."""


def status_of(exc: DpcdfError) -> int:
    return next(STATUS[cls] for cls in type(exc).__mro__ if cls in STATUS)


def _answer(request: Request, status: int, reason: str, headers: Mapping[str, str] | None = None) -> JSONResponse:
    """The error's JSON answer, and one log line with its reason (issue 46: the access log has the status
    only): the reason is the text the client gets too, which names no secret and no report's contents;
    a failed call to the other server is its 502 here. JSON, so that `--log-format json` merges it."""
    log = logging.getLogger("dpcdf.requests")
    (log.warning if status >= 500 else log.info)(json.dumps(
        {"event": "refused", "method": request.method, "path": request.url.path, "status": status, "reason": reason}))
    return JSONResponse({"error": reason}, status_code=status, headers=headers)


async def domain_error(request: Request, exc: DpcdfError) -> JSONResponse:
    return _answer(request, status_of(exc), str(exc))


async def http_error(request: Request, exc: HttpError) -> JSONResponse:
    return _answer(request, exc.status, exc.message, exc.headers)


async def invalid_request(request: Request, exc: RequestValidationError) -> JSONResponse:
    return _answer(request, 400, problem(exc.errors()[0]))


async def starlette_error(request: Request, exc: HTTPException) -> JSONResponse:
    # FastAPI answers a body it cannot parse (nested too deep for json) with this 400
    message = NOT_JSON if exc.detail == "There was an error parsing the body" else str(exc.detail)
    return _answer(request, exc.status_code, message, exc.headers)


# each handler takes its own exception type (Starlette calls the one of the exception's class)
HANDLERS: dict[type[Exception], Callable[[Request, Any], Awaitable[JSONResponse]]] = {
    HttpError: http_error, RequestValidationError: invalid_request, HTTPException: starlette_error,
    **{cls: domain_error for cls in STATUS}}
