"""Who may ask a server what, besides the routes' own checks: the operator's token (from a file, the
environment, or made at the first start) and the per-analyst limit on expensive requests (closes and
queries in flight), refused with a 429 rather than queued."""
from __future__ import annotations

import os
import secrets
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from ...errors import DpcdfError
from ..files import write_secret
from .errors import HttpError

ADMIN_ENV = "DPCDF_ADMIN_TOKEN"
ANALYST_LIMIT_ENV = "DPCDF_ANALYST_CONCURRENCY"
ANALYST_LIMIT = 2  # expensive requests (closes, queries) in flight per analyst token: one running, one waiting
RETRY_AFTER = 2  # seconds, in the 429's Retry-After header


class Throttled(HttpError):
    """429 with a Retry-After header: too many of one analyst's expensive requests at once."""

    def __init__(self, message: str, retry_after: int = RETRY_AFTER):
        super().__init__(429, message, {"Retry-After": str(retry_after)})


class Limiter:
    """At most `limit` requests in flight per key; the next one is refused at once (`Throttled`)
    rather than queued, so one client cannot fill the server's thread pool with waiting requests."""

    def __init__(self, limit: int, what: str):
        if limit < 1:
            raise DpcdfError(f"a request limit must be >= 1, got {limit}")
        self.limit, self.what = limit, what
        self._busy: dict[str, int] = {}
        self._lock = threading.Lock()

    @contextmanager
    def slot(self, key: str) -> Iterator[None]:
        with self._lock:
            busy = self._busy.get(key, 0)
            if busy >= self.limit:
                raise Throttled(f"{self.what}: at most {self.limit} at once; try again in {RETRY_AFTER} s")
            self._busy[key] = busy + 1
        try:
            yield
        finally:
            with self._lock:
                left = self._busy.pop(key) - 1
                if left:
                    self._busy[key] = left


def operator_token(data: Path, path: str | Path | None) -> str:
    """The operator's token: from `path`, else $DPCDF_ADMIN_TOKEN, else DATA/admin.token (made at the
    first start, 0600). Only its hash is kept in memory."""
    if path is None and os.environ.get(ADMIN_ENV):
        return os.environ[ADMIN_ENV]
    file = Path(path) if path is not None else data / "admin.token"
    if path is None and not file.exists():
        write_secret(file, secrets.token_urlsafe(32).encode())
    try:
        token = file.read_text().strip()
    except OSError as exc:
        raise DpcdfError(f"cannot read the operator token file {file}: {exc}") from None
    if len(token) < 16:
        raise DpcdfError(f"the operator token in {file} is shorter than 16 characters")
    return token
