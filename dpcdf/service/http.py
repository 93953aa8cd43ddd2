"""The HTTP client that the analyst, the clients and the process helpers share: JSON in and out,
every failure (an error status, a refused or broken connection) as one `ServerError`."""
from __future__ import annotations

import http.client as http_client
import json
import urllib.error
import urllib.request

from ..errors import DpcdfError


class ServerError(DpcdfError):
    """A server refused or failed a request (the message carries its status and reason). `status` is
    the HTTP status, or None when no answer came (refused, reset or timed-out connection)."""

    def __init__(self, message: str, status: int | None = None):
        super().__init__(message)
        self.status = status

    @property
    def retryable(self) -> bool:
        """Worth sending again unchanged: no answer, a 5xx, or 429 (the server may recover)."""
        return self.status is None or self.status >= 500 or self.status == 429


def http(method: str, url: str, body: bytes | None = None, token: str | None = None,
         content_type: str = "application/json", timeout: float = 600) -> dict:
    """A JSON request; the answer's JSON."""
    return json.loads(fetch(method, url, body, token, content_type, timeout) or b"{}")


def fetch(method: str, url: str, body: bytes | None = None, token: str | None = None,
          content_type: str = "application/json", timeout: float = 600, headers: dict[str, str] | None = None) -> bytes:
    """A request (with any extra `headers`); the answer's bytes. Any failure is a ServerError (with the
    status, if one came)."""
    try:
        req = urllib.request.Request(url, data=body, method=method, headers=headers or {})
    except ValueError as exc:  # not an http(s) URL
        raise ServerError(f"{url}: {exc}") from None
    if body is not None:
        req.add_header("Content-Type", content_type)
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.read()
    except urllib.error.HTTPError as exc:
        try:
            reason = json.loads(exc.read()).get("error", "")
        except ValueError:
            reason = ""
        raise ServerError(f"{url}: HTTP {exc.code} {reason}".strip(), exc.code) from None
    except urllib.error.URLError as exc:
        raise ServerError(f"{url}: {exc.reason}") from None
    except (http_client.HTTPException, OSError) as exc:  # the connection broke mid-request
        raise ServerError(f"{url}: {exc.__class__.__name__}: {exc}") from None
