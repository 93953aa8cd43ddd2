"""The HTTP client that the analyst, the clients, the process helpers and server 0 (to reach server 1)
share: JSON in and out, every failure (an error status, a refused or broken connection) as one
`ServerError`. HTTPS certificates are verified against the system's CAs, or only those of the PEM
file in $DPCDF_CA_FILE (`use_ca_file`: `dpcdf --ca-file`, `dpcdf serve --ca-file`)."""
from __future__ import annotations

import functools
import http.client as http_client
import json
import os
import ssl
import urllib.error
import urllib.request

from ..errors import DpcdfError, ParameterError

CA_ENV = "DPCDF_CA_FILE"


@functools.lru_cache(maxsize=4)
def _context(ca_file: str) -> ssl.SSLContext:
    try:
        return ssl.create_default_context(cafile=ca_file)
    except (OSError, ssl.SSLError, ValueError) as exc:
        raise ParameterError(f"--ca-file {ca_file}: not a readable PEM file of CA certificates ({exc})") from None


def use_ca_file(path: str) -> None:
    """Verify HTTPS servers against the CA certificates in `path` (PEM) only, in this process and those
    it starts ($DPCDF_CA_FILE); ParameterError at once for a file that is not one."""
    _context(str(path))
    os.environ[CA_ENV] = str(path)


def tls_context() -> ssl.SSLContext | None:
    """The context HTTPS requests use: $DPCDF_CA_FILE's CAs, else None (the system's)."""
    path = os.environ.get(CA_ENV)
    return _context(path) if path else None


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
        with urllib.request.urlopen(req, timeout=timeout, context=tls_context() if url.startswith("https:") else None) as resp:
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
