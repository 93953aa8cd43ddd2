"""The operator's side of the admin API (`dpcdf admin`): each call sends the operator's bearer token to
one server (`dpcdf.service.server.routers.admin`, GET /metrics) and returns its answer."""
from __future__ import annotations

import os
from pathlib import Path

from ...errors import DpcdfError
from ..http import fetch, http

ADMIN_ENV = "DPCDF_ADMIN_TOKEN"


def operator_token(token_file: str | Path | None = None) -> str:
    """The operator's token: from `token_file`, else $DPCDF_ADMIN_TOKEN (DpcdfError if neither)."""
    if token_file is not None:
        try:
            token = Path(token_file).read_text().strip()
        except OSError as exc:
            raise DpcdfError(f"cannot read the operator token file {token_file}: {exc.strerror or exc}") from None
    else:
        token = os.environ.get(ADMIN_ENV, "").strip()
    if not token:
        raise DpcdfError(f"the admin commands need the server's operator token: --token-file FILE or ${ADMIN_ENV}")
    return token


def tasks(server: str, token: str) -> dict:
    """{"party": ..., "tasks": [...]}: every task on the server, with its state and counts."""
    return http("GET", f"{server.rstrip('/')}/admin/tasks", token=token)


def close(server: str, token: str, task_id: str) -> dict:
    """Closes the task as its analyst's close does (server 0 only)."""
    return http("POST", f"{server.rstrip('/')}/admin/tasks/{task_id}/close", token=token)


def delete(server: str, token: str, task_id: str) -> dict:
    """Deletes the task's key shares and all but its row on this server."""
    return http("DELETE", f"{server.rstrip('/')}/admin/tasks/{task_id}", token=token)


def sweep(server: str, token: str) -> dict:
    """Runs the server's retention sweep now; {"purged": [...]}."""
    return http("POST", f"{server.rstrip('/')}/admin/retention", token=token)


def metrics(server: str, token: str) -> str:
    """The server's GET /metrics (Prometheus text format)."""
    return fetch("GET", f"{server.rstrip('/')}/metrics", token=token).decode()
