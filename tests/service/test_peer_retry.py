"""Server 0's sends to server 1 while server 1 is still evaluating its reports for the check (503):
again after 20 ms, doubling to a second (`peers.CHECK_RETRY`), not a flat second. A real HTTP server on
loopback answers 503 a few times, then the message's answer."""
from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from dpcdf.service.server import peers
from dpcdf.service.server.context import PeerFailed


def _server(busy: int):
    seen = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 (http.server's name)
            body = self.rfile.read(int(self.headers["Content-Length"]))
            seen.append(time.monotonic())
            status, out = (503, b'{"detail": "server 1 is still evaluating"}') if len(seen) <= busy else (200, b"answer:" + body)
            self.send_response(status)
            self.send_header("Content-Type", "application/json" if status == 503 else "application/octet-stream")
            self.send_header("Content-Length", str(len(out)))
            self.end_headers()
            self.wfile.write(out)

        def log_message(self, *args):
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    return httpd, f"http://127.0.0.1:{httpd.server_address[1]}/tasks/t/verify", seen


def test_a_busy_server_1_is_asked_again_soon_then_less_often():
    httpd, url, seen = _server(busy=4)
    try:
        t = time.monotonic()
        assert peers._post(url, b"m", {}, patient=True) == b"answer:m"
        took = time.monotonic() - t
    finally:
        httpd.shutdown()
    gaps = [b - a for a, b in zip(seen, seen[1:])]
    assert len(seen) == 5 and took < 0.6, (took, gaps)  # 0.02 + 0.04 + 0.08 + 0.16 s of pauses, not 4 s
    assert all(later > 1.5 * earlier for earlier, later in zip(gaps, gaps[1:])), gaps  # doubling
    assert peers.CHECK_RETRY[1] <= 1.0  # never less often than once a second (a long check: CHECK_WAIT)


def test_a_503_outside_the_check_is_a_failure_at_once():
    httpd, url, seen = _server(busy=1)
    try:
        with pytest.raises(PeerFailed):
            peers._post(url, b"m", {}, patient=False)
    finally:
        httpd.shutdown()
    assert len(seen) == 1
