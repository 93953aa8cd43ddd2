"""The FastAPI application: the routers, the error handlers, the body-size limit, the shared state.

Endpoints are plain `def`s, so FastAPI runs them in its thread pool: a large request does not hold
up the others; a task's close and queries take the task's own lock (`TaskState.answering`) and run
one at a time, while other tasks proceed. The schema is at /openapi.json, the docs at /docs."""
from __future__ import annotations

import os
from pathlib import Path

from fastapi import FastAPI
from fastapi.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ...errors import DpcdfError
from .errors import HANDLERS
from .models import TaskSpec
from .routers import health, queries, reports, tasks
from .state import Server

MAX_BODY = 64 << 20
TESTING_ENV = "DPCDF_TESTING"


def create_app(party: int, data_dir: str | Path, noise: bool = True, warm_up: bool = True,
               admin_token_file: str | Path | None = None, dask: str | None = None) -> FastAPI:
    """Server `party` (0 or 1) over the store in `data_dir`. `noise=False` is a test-only setting
    (it needs DPCDF_TESTING=1); `warm_up` compiles the kernels in the background at once. The
    operator's token (needed to register tasks) comes from `admin_token_file`, else the environment's
    DPCDF_ADMIN_TOKEN, else a token made at the first start in DATA/admin.token (0600). `dask`: evaluate
    on a Dask cluster, a scheduler's address ("tcp://host:8786") or "local:N" (a LocalCluster of N
    worker processes), see `dpcdf.service.dask_eval`; None evaluates in-process."""
    if party not in (0, 1):
        raise DpcdfError(f"party must be 0 or 1, got {party!r}")
    if not noise and os.environ.get(TESTING_ENV) != "1":
        raise DpcdfError(f"switching noise off is a test-only setting (needs {TESTING_ENV}=1)")
    app = FastAPI(title=f"dpcdf server {party}", version="1",
                  description="One of the two servers of a two-server DP ECDF (function secret sharing).")
    app.state.server = Server(party, data_dir, noise, admin_token_file, dask=dask)
    app.router.on_shutdown.append(app.state.server.close)
    for router in (health.router, tasks.router, reports.router, queries.router):
        app.include_router(router)
    for exc, handler in HANDLERS.items():
        app.add_exception_handler(exc, handler)
    app.add_middleware(BodyLimit, limit=MAX_BODY)
    app.openapi = _schema(app)
    if warm_up:
        app.state.server.warm_up()
    return app


class BodyLimit:
    """Refuses a body over `limit` bytes with 413: at once if its Content-Length says so, else when
    the bytes read pass the limit (the body is read here, then handed on)."""

    def __init__(self, app: ASGIApp, limit: int):
        self.app, self.limit = app, limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        length = dict(scope["headers"]).get(b"content-length")
        if length is not None and (not length.isdigit() or int(length) > self.limit):
            return await self._refuse(scope, receive, send)
        chunks, size, more = [], 0, True
        while more:
            message = await receive()
            if message["type"] != "http.request":  # the client went away
                return
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            if size > self.limit:
                return await self._refuse(scope, receive, send)
            more = message.get("more_body", False)
        pending: list[Message] = [{"type": "http.request", "body": b"".join(chunks), "more_body": False}]

        async def replay() -> Message:
            return pending.pop() if pending else await receive()

        await self.app(scope, replay, send)

    async def _refuse(self, scope: Scope, receive: Receive, send: Send) -> None:
        await JSONResponse({"error": f"request body over {self.limit} bytes"}, status_code=413)(scope, receive, send)


def _schema(app: FastAPI):
    """app.openapi with the task config's model (read by hand, see `TaskSpec`) and without FastAPI's
    generated 422 responses: this server answers invalid requests with 400, documented per route."""
    generate = app.openapi

    def openapi() -> dict:
        if app.openapi_schema is None:
            schema = generate()
            for path in schema["paths"].values():
                for operation in path.values():
                    operation.get("responses", {}).pop("422", None)
            models = schema.setdefault("components", {}).setdefault("schemas", {})
            for name in ("HTTPValidationError", "ValidationError"):
                models.pop(name, None)
            models["TaskSpec"] = TaskSpec.model_json_schema(ref_template="#/components/schemas/{model}")
        return app.openapi_schema

    return openapi


def serve(party: int, port: int, data_dir: str, host: str = "127.0.0.1", noise: bool = True,
          admin_token_file: str | None = None, tls_cert: str | None = None, tls_key: str | None = None,
          dask: str | None = None) -> None:
    """Runs the server with uvicorn; with `tls_cert` and `tls_key` (PEM files) over HTTPS. Clients and
    the other server verify the certificate against the system's CAs, or SSL_CERT_FILE's."""
    import uvicorn

    if (tls_cert is None) != (tls_key is None):
        raise DpcdfError("TLS needs both --tls-cert and --tls-key")
    uvicorn.run(create_app(party, data_dir, noise, admin_token_file=admin_token_file, dask=dask), host=host, port=port,
                log_level="warning", ssl_certfile=tls_cert, ssl_keyfile=tls_key)
