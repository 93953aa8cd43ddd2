"""The FastAPI application: the routers, the error handlers, the limits on what one client can hold
(`limits`: body sizes and timeouts, upload slots, failure levels), the shared state.

Endpoints are plain `def`s, so FastAPI runs them in its thread pool: a large request does not hold
up the others; a task's close and queries take the task's own lock (`TaskState.answering`) and run
one at a time, while other tasks proceed. The schema is at /openapi.json, the docs at /docs."""
from __future__ import annotations

import json
import os
from pathlib import Path

from fastapi import FastAPI

from ...errors import DpcdfError
from ..files import private_dir
from ..storage.backup import mark_unmarked
from .errors import HANDLERS
from .connections import uvicorn_options
from .limits import MAX_BODY, Failures, Guard, Limits  # noqa: F401 (MAX_BODY: the package's name)
from .models import TaskSpec
from .reserve import Reserve
from . import metrics
from .housekeeping import SWEEP_EVERY, Retention
from .routers import admin, exchange, health, queries, reports, tasks
from .routers import metrics as metrics_router
from .ownership import hold
from .state import Server

TESTING_ENV = "DPCDF_TESTING"


def create_app(party: int, data_dir: str | Path, noise: bool = True, warm_up: bool = True,
               admin_token_file: str | Path | None = None, dask: str | None = None,
               limits: Limits | None = None, retention: float | None = None,
               sweep_every: float = SWEEP_EVERY, dask_insecure: bool = False) -> FastAPI:
    """Server `party` (0 or 1) over the store in `data_dir`. `noise=False` is a test-only setting
    (it needs DPCDF_TESTING=1); `warm_up` compiles the kernels in the background at once. The
    operator's token (needed to register tasks) comes from `admin_token_file`, else the environment's
    DPCDF_ADMIN_TOKEN, else a token made at the first start in DATA/admin.token (0600). `dask`: evaluate
    on a Dask cluster, a scheduler's address ("tls://host:8786"; a plain tcp:// one only with
    `dask_insecure`) or "local:N" (a LocalCluster of N worker processes), see
    `dpcdf.service.server.dask_eval`; None evaluates in-process. `limits`: what one
    client may hold (`limits.Limits`; its defaults are the documented ones). `retention`: seconds after
    which a task's key shares are deleted if still stored, None for never (`housekeeping`; verified
    tasks' are deleted once their release is final, whatever it is); the sweep runs every `sweep_every`
    seconds. GET /metrics and /admin/* need the operator's token. The data directory and
    everything the server writes in it are its owner's only (0700 folders, 0600 files)."""
    if party not in (0, 1):
        raise DpcdfError(f"party must be 0 or 1, got {party!r}")
    if not noise and os.environ.get(TESTING_ENV) != "1":
        raise DpcdfError(f"switching noise off is a test-only setting (needs {TESTING_ENV}=1)")
    app = FastAPI(title=f"dpcdf server {party}", version="1",
                  description="One of the two servers of a two-server DP ECDF (function secret sharing).")
    private_dir(data_dir)
    app.state.limits = limits = limits or Limits()
    app.state.failures = failures = Failures(limits)
    app.state.bodies = private_dir(Path(data_dir) / "incoming")  # bodies over limits.memory_bytes, unlinked files
    mark_unmarked(data_dir)  # a backup made before restore marks, first served: marked before its Store opens
    app.state.server = Server(party, data_dir, noise, admin_token_file, dask=dask, dask_insecure=dask_insecure)
    app.router.on_shutdown.append(app.state.server.close)
    app.state.metrics = metrics.Metrics()  # issue 24: GET /metrics, retention and the admin routes
    metrics.attach(app.state.metrics)
    app.state.retention = Retention(app.state.server, data_dir, retention, sweep_every)
    app.router.on_startup.append(app.state.retention.start)
    app.router.on_shutdown.append(app.state.retention.stop)
    for router in (health.router, tasks.router, exchange.router, reports.router, queries.router, admin.router, metrics_router.router):
        app.include_router(router)
    for exc, handler in HANDLERS.items():
        app.add_exception_handler(exc, handler)
    gate = app.state.server.peer_gate
    app.state.reserve = reserve = Reserve(gate, app.state.server.admin_hash)  # room for keys (issue 42)
    app.add_middleware(Guard, limits=limits, failures=failures, gate=gate, reserve=reserve)  # peers: issue 42
    app.add_middleware(metrics.Middleware, metrics=app.state.metrics)  # outermost: sees the Guard's refusals too
    app.openapi = _schema(app)  # type: ignore[method-assign]  # FastAPI's documented way to change the schema
    if warm_up:
        app.state.server.warm_up()
    return app


def _schema(app: FastAPI):
    """app.openapi with the task config's model (read by hand, see `TaskSpec`) and without FastAPI's
    generated 422 responses: this server answers invalid requests with 400, documented per route."""
    generate = app.openapi

    def openapi() -> dict:
        schema = app.openapi_schema
        if schema is None:
            schema = generate()  # (FastAPI's: it keeps it as app.openapi_schema)
            for path in schema["paths"].values():
                for operation in path.values():
                    operation.get("responses", {}).pop("422", None)
            models = schema.setdefault("components", {}).setdefault("schemas", {})
            for name in ("HTTPValidationError", "ValidationError"):
                models.pop(name, None)
            models["TaskSpec"] = TaskSpec.model_json_schema(ref_template="#/components/schemas/{model}")
        return schema

    return openapi


def serve(party: int, port: int, data_dir: str, host: str = "127.0.0.1", noise: bool = True,
          admin_token_file: str | None = None, tls_cert: str | None = None, tls_key: str | None = None,
          dask: str | None = None, log_format: str = "text", retention: float | None = None,
          sweep_every: float = SWEEP_EVERY, dask_insecure: bool = False, limits: Limits | None = None) -> None:
    """Runs the server with uvicorn; with `tls_cert` and `tls_key` (PEM files) over HTTPS. Clients and
    the other server verify the certificate against the system's CAs, or SSL_CERT_FILE's. `limits`: what
    one client may hold (`limits.Limits`, whose defaults are the documented ones; `dpcdf serve
    --client-prefix-v4/--client-prefix-v6` set its address prefixes).

    Logs to stderr: at the start, the URL, party, data directory and where the operator token is; then
    one line per request (`log_format` "text": uvicorn's access log; "json": one JSON object per line
    with time, client, method, path, status). No line carries a token or a report."""
    import logging
    import uvicorn

    if (tls_cert is None) != (tls_key is None):
        raise DpcdfError("TLS needs both --tls-cert and --tls-key")
    if log_format not in ("text", "json"):
        raise DpcdfError(f"log_format must be text or json, got {log_format!r}")
    if dask is not None:  # before anything starts: a plain tcp:// scheduler only with dask_insecure (issue 42)
        from .dask_eval import check_address

        check_address(dask, dask_insecure)
    _check_listen(host, port)
    private_dir(data_dir)
    lock = hold(Path(data_dir))  # noqa: F841 (held until this process ends: one server per data directory)
    app = create_app(party, data_dir, noise, admin_token_file=admin_token_file, dask=dask, retention=retention,
                     sweep_every=sweep_every, dask_insecure=dask_insecure, limits=limits)
    app.state.server.probe_peer = True  # a real server 0 reaches server 1 at each registration (`peers.probe`)
    if admin_token_file is not None:
        token_at = admin_token_file
    elif os.environ.get("DPCDF_ADMIN_TOKEN"):
        token_at = "$DPCDF_ADMIN_TOKEN"
    else:
        token_at = str(Path(data_dir) / "admin.token")
    url = f"{'https' if tls_cert else 'http'}://{host}:{port}"
    facts = {"url": url, "party": party, "data": str(Path(data_dir).resolve()), "operator_token": token_at,
             "noise": noise, "evaluation": dask or "in-process"}
    if log_format == "json":
        _start_line = json.dumps({"event": "start", **facts})
    else:
        _start_line = (f"dpcdf server {party} at {url}; data {facts['data']}; operator token in {token_at}"
                       + ("" if noise else "; NOISE OFF (test-only)") + (f"; Dask {dask}" if dask else ""))
    config = uvicorn.Config(app, host=host, port=port, ssl_certfile=tls_cert, ssl_keyfile=tls_key,
                            log_level="info", access_log=True, log_config=_log_config(log_format, party),
                            **uvicorn_options(app))
    server = uvicorn.Server(config)
    logging.getLogger("dpcdf.serve").info(_start_line)
    server.run()


def _check_listen(host: str, port: int) -> None:
    """A DpcdfError (one line on the command line) if this process cannot listen on host:port, rather
    than uvicorn's log line and exit status 1 after the app was built."""
    import socket

    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise DpcdfError(f"cannot listen on {host}:{port}: {exc.strerror}") from None
    family, kind, proto, _, address = infos[0]
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn does
        try:
            probe.bind(address)
        except OSError as exc:
            raise DpcdfError(f"cannot listen on {host}:{port}: {exc.strerror} (another server there? choose "
                             "another --port)") from None


def _log_config(log_format: str, party: int) -> dict:
    """uvicorn's logging: warnings and errors, the access log, dpcdf's start line and its own events
    (INFO and up), all on stderr."""
    fmt = {"text": {"()": "uvicorn.logging.DefaultFormatter", "fmt": "%(asctime)s %(levelprefix)s %(message)s",
                    "use_colors": False},
           "access": {"()": "uvicorn.logging.AccessFormatter", "use_colors": False,
                      "fmt": f"%(asctime)s server {party} %(client_addr)s \"%(request_line)s\" %(status_code)s"},
           "plain": {"format": "%(asctime)s %(message)s"}}
    if log_format == "json":
        fmt = {name: {"()": f"{__name__}._JsonFormatter", "party": party} for name in ("text", "access", "plain")}
    handler = {"class": "logging.StreamHandler", "stream": "ext://sys.stderr"}
    return {"version": 1, "disable_existing_loggers": False, "formatters": fmt,
            "handlers": {"text": {**handler, "formatter": "text"}, "access": {**handler, "formatter": "access"},
                         "plain": {**handler, "formatter": "plain"}},
            "loggers": {"uvicorn": {"handlers": ["text"], "level": "WARNING", "propagate": False},
                        "uvicorn.error": {"handlers": ["text"], "level": "WARNING", "propagate": False},
                        "uvicorn.access": {"handlers": ["access"], "level": "INFO", "propagate": False},
                        "dpcdf.serve": {"handlers": ["plain"], "level": "INFO", "propagate": False},
                        # the server's own events (retention purges; round one's, segments' and a restore's
                        # warnings), formatted as the rest: without it only Python's last-resort handler
                        # printed warnings, bare, and the purges' info lines went nowhere
                        "dpcdf": {"handlers": ["text"], "level": "INFO", "propagate": False}}}


class _JsonFormatter:
    """One JSON object per log line: time, party, level, and for a request client, method, path, status."""

    def __init__(self, party: int = 0):
        import logging

        self.party, self._time = party, logging.Formatter()

    def format(self, record) -> str:
        out = {"time": self._time.formatTime(record), "party": self.party, "level": record.levelname.lower()}
        args = record.args
        if record.name == "uvicorn.access" and isinstance(args, tuple) and len(args) == 5:
            client, method, path, version, status = args
            out.update(event="request", client=client, method=method, path=path, status=status)
        else:
            message = record.getMessage()
            try:
                parsed = json.loads(message)
                out.update(parsed if isinstance(parsed, dict) else {"message": message})
            except ValueError:
                out["message"] = message
        return json.dumps(out)
