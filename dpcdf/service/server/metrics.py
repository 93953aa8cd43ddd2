"""GET /metrics in the Prometheus text exposition format (version 0.0.4), written here: a few counters,
gauges and one histogram need no dependency.

What it shows, to the operator only (the route needs the operator's token, `routers.metrics`):
requests by method, route template and status, and their latencies (histogram); reports accepted,
duplicate and refused by reason; uploads refused whole by reason; closes and queries by status; the
report check's backlog; tasks by state; retention purges; failures (5xx answers, errors logged by the
server's background work). Labels are route templates (`/tasks/{task_id}/query`), never task ids,
tokens or report contents. Counts of one task's reports are not shown per task; the sums over tasks
are the operator's to see (the operator runs the server and its store)."""
from __future__ import annotations

import logging
import math
import threading
import time
from collections import Counter
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .housekeeping import Retention
    from .state import Server

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, math.inf)
UPLOAD_ROUTES = ("/tasks/{task_id}/reports", "/tasks/{task_id}/reports/batch")
UPLOAD_REFUSALS = {400: "malformed", 408: "slow_body", 409: "closed", 411: "no_length", 413: "too_large", 429: "throttled"}


def reason(error: str) -> str:
    """A refused report's reason class, from its error (`ingest.accept`)."""
    from ..wire import FOREIGN, TAKEN

    if error == FOREIGN:
        return "foreign_task"
    if error == TAKEN:
        return "id_taken"
    if "sealed share must be" in error:
        return "wrong_length"
    if "not a key of this task" in error:
        return "not_a_key"
    if "open" in error or "seal" in error or "decrypt" in error:
        return "does_not_open"
    return "malformed"


class Metrics:
    """The counters, updated by the middleware (`Middleware`), the upload routes (`count_reports`) and
    a logging handler (errors logged by the server's threads), read by `render`."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.started = time.time()
        self.requests: Counter = Counter()  # (method, route, status)
        self.latency: dict[tuple[str, str], list] = {}  # (method, route) -> [bucket counts..., sum]
        self.reports: Counter = Counter()  # ("accepted"|"duplicate"|"refused", reason)
        self.errors: Counter = Counter()  # logger name
        self.handler = _ErrorCounter(self)

    def observe(self, method: str, route: str, status: int, seconds: float) -> None:
        with self._lock:
            self.requests[method, route, status] += 1
            row = self.latency.setdefault((method, route), [0] * len(BUCKETS) + [0.0])
            for i, bound in enumerate(BUCKETS):
                if seconds <= bound:
                    row[i] += 1
                    break
            row[-1] += seconds

    def count_reports(self, accepted: int, duplicates: int, refused: list[str]) -> None:
        with self._lock:
            self.reports["accepted", ""] += accepted
            self.reports["duplicate", ""] += duplicates
            for error in refused:
                self.reports["refused", reason(error)] += 1

    def render(self, server: "Server", retention: "Retention | None" = None) -> str:
        out = _Out()
        with self._lock:
            requests, latency, reports, errors = dict(self.requests), {k: list(v) for k, v in self.latency.items()}, dict(self.reports), dict(self.errors)
        out.family("dpcdf_start_time_seconds", "gauge", "when this server started (Unix time)")
        out.sample("dpcdf_start_time_seconds", {}, self.started)
        out.family("dpcdf_http_requests_total", "counter", "requests answered, by method, route template and status")
        for (method, route, status), n in sorted(requests.items()):
            out.sample("dpcdf_http_requests_total", {"method": method, "route": route, "status": str(status)}, n)
        out.family("dpcdf_http_request_duration_seconds", "histogram", "time to answer a request, by method and route")
        for (method, route), row in sorted(latency.items()):
            labels, cumulative = {"method": method, "route": route}, 0
            for bound, n in zip(BUCKETS, row):
                cumulative += n
                out.sample("dpcdf_http_request_duration_seconds_bucket", {**labels, "le": _le(bound)}, cumulative)
            out.sample("dpcdf_http_request_duration_seconds_sum", labels, row[-1])
            out.sample("dpcdf_http_request_duration_seconds_count", labels, cumulative)
        out.family("dpcdf_reports_accepted_total", "counter", "reports stored (new report ids)")
        out.sample("dpcdf_reports_accepted_total", {}, reports.get(("accepted", ""), 0))
        out.family("dpcdf_reports_duplicate_total", "counter", "reports stored already with the same bytes (counted once)")
        out.sample("dpcdf_reports_duplicate_total", {}, reports.get(("duplicate", ""), 0))
        out.family("dpcdf_reports_refused_total", "counter", "reports refused one by one, by reason")
        for (kind, why), n in sorted(reports.items()):
            if kind == "refused":
                out.sample("dpcdf_reports_refused_total", {"reason": why}, n)
        out.family("dpcdf_uploads_refused_total", "counter", "uploads (one report or a batch) refused whole, by reason")
        refused: Counter[str] = Counter()
        for (method, route, status), n in requests.items():
            if route in UPLOAD_ROUTES and status >= 400:
                refused[UPLOAD_REFUSALS.get(status, "other")] += n
        for why, n in sorted(refused.items()):
            out.sample("dpcdf_uploads_refused_total", {"reason": why}, n)
        for name, route in (("closes", "/tasks/{task_id}/close"), ("queries", "/tasks/{task_id}/query")):
            out.family(f"dpcdf_{name}_total", "counter", f"analysts' {name}, by status")
            for (method, r, status), n in sorted(requests.items()):
                if r == route and method == "POST":
                    out.sample(f"dpcdf_{name}_total", {"status": str(status)}, n)
        out.family("dpcdf_check_backlog", "gauge", "1 while round one of verified reports has work queued or running")
        out.sample("dpcdf_check_backlog", {}, int(server.checker.backlog()))
        out.family("dpcdf_tasks", "gauge", "tasks stored, by state")
        states = Counter(t["state"] for t in retention.tasks(counts=False)) if retention is not None else Counter()
        for state in ("collecting", "closed", "reconciled", "verified", "answered", "released", "expired", "deleted"):
            out.sample("dpcdf_tasks", {"state": state}, states.get(state, 0))
        out.family("dpcdf_retention_purged_total", "counter", "tasks whose key shares were deleted, by reason")
        for why in ("released", "expired", "deleted"):
            out.sample("dpcdf_retention_purged_total", {"reason": why}, retention.purged.get(why, 0) if retention else 0)
        out.family("dpcdf_retention_sweeps_total", "counter", "retention sweeps finished")
        out.sample("dpcdf_retention_sweeps_total", {}, retention.sweeps if retention else 0)
        out.family("dpcdf_failures_total", "counter", "failures: 5xx answers (where=request) and errors logged by the "
                   "server's background work (where=its logger)")
        out.sample("dpcdf_failures_total", {"where": "request"}, sum(n for (_, _, s), n in requests.items() if s >= 500))
        for name, n in sorted(errors.items()):
            out.sample("dpcdf_failures_total", {"where": name}, n)
        return out.text()


class _ErrorCounter(logging.Handler):
    """Counts records at ERROR and above by logger name (attached to 'dpcdf' and 'uvicorn.error')."""

    def __init__(self, metrics: Metrics):
        super().__init__(logging.ERROR)
        self.metrics = metrics

    def emit(self, record: logging.LogRecord) -> None:
        with self.metrics._lock:
            self.metrics.errors[record.name] += 1


def attach(metrics: Metrics) -> None:
    """Counts errors logged in this process for `metrics` (one app per server process: the last app
    made counts them)."""
    for name in ("dpcdf", "uvicorn.error"):
        logger = logging.getLogger(name)
        for old in [h for h in logger.handlers if isinstance(h, _ErrorCounter)]:
            logger.removeHandler(old)
        logger.addHandler(metrics.handler)


class Middleware:
    """Pure ASGI: times every HTTP request and records its status under its route template (read from
    the scope the router fills in; 'unmatched' for a path no route takes)."""

    def __init__(self, app, metrics: Metrics):
        self.app, self.metrics = app, metrics

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        start, status = time.perf_counter(), [500]

        async def sending(message) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, sending)
        finally:
            route = scope.get("route")
            self.metrics.observe(scope["method"], getattr(route, "path", "unmatched"), status[0],
                                 time.perf_counter() - start)


def _le(bound: float) -> str:
    return "+Inf" if math.isinf(bound) else repr(bound)


class _Out:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def family(self, name: str, kind: str, text: str) -> None:
        self.lines += [f"# HELP {name} {text}", f"# TYPE {name} {kind}"]

    def sample(self, name: str, labels: dict, value) -> None:
        body = ",".join(f'{k}="{_escape(v)}"' for k, v in labels.items())
        self.lines.append(f"{name}{{{body}}} {_number(value)}" if body else f"{name} {_number(value)}")

    def text(self) -> str:
        return "\n".join(self.lines) + "\n"


def _escape(value: str) -> str:
    return str(value).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _number(value) -> str:
    if isinstance(value, float):
        return "+Inf" if value == math.inf else repr(value)
    return str(int(value))
