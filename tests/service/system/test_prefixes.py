"""Budgets per address prefix (issue 42, item 2): uploads in flight, declared bytes, failures and
connections count per IPv4 /24 (IPv6 /64), not per address, so an attacker's neighbouring addresses
share one budget; and the Guard's own refusals (408, 411, 413, a 400 Content-Length, 429 over the
prefix's own budget) are charged to the prefix. Each test uses a /24 of its own (127.0.4x.y); on the
code before, the same tests fail: each address had a budget of its own and those refusals cost nothing."""
from __future__ import annotations

import time

import pytest

from dpcdf.service.client import create_task, make_reports
from dpcdf.service.server.limits import Failures, Limits, prefix_of
from helpers import GRID, urls
from test_exhaustion import LIMITS, connect, post


@pytest.fixture(scope="module")
def task(servers):
    procs, _ = servers
    pair = procs["exact"]
    config, _ = create_task(urls(pair), GRID, 1.0, "tree", "substitution", min_batch=1, verify=False)
    return config, int(pair[0][1].rsplit(":", 1)[1])


def test_a_prefix_is_a_network():
    limits = Limits()
    assert prefix_of("192.0.2.77", limits) == "192.0.2.0/24" and prefix_of("::ffff:192.0.2.9", limits) == "192.0.2.0/24"
    assert prefix_of("2001:db8:1:2:3:4:5:6", limits) == "2001:db8:1:2::/64"
    assert prefix_of("192.0.2.77", Limits(prefix_v4=32)) == "192.0.2.77/32"  # configurable: per address again
    assert prefix_of("unknown", limits) == "unknown"


def test_failures_are_counted_per_prefix():
    """Two addresses of one /24 share a level and its refusal; an address of the next /24 does not."""
    now = [0.0]
    f = Failures(Limits(), clock=lambda: now[0])
    f.charge("198.51.100.1", 20)
    f.charge("198.51.100.200", 12)
    assert f.refused_for("198.51.100.7") > 0 and f.allowance("198.51.100.99") == 0
    assert f.level("198.51.101.1") == 0 and f.refused_for("198.51.101.1") == 0
    f.charge("2001:db8::1", 32)
    assert f.refused_for("2001:db8::ffff") > 0 and f.level("2001:db8:0:1::1") == 0


def test_uploads_in_flight_are_capped_per_prefix_not_per_address(task):
    """Eight stalled uploads from eight addresses of one /24 hold its eight slots: a ninth address of
    that /24 gets 429, an address of another /24 is served. Before, each address had eight."""
    config, port = task
    path = f"/tasks/{config.task_id}/reports"
    held = []
    for i in range(LIMITS.uploads_per_address):
        s = connect(port, f"127.0.40.{1 + i}")
        s.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\nab".encode())
        held.append(s)
    try:
        time.sleep(0.3)
        status, _, body = post(port, "127.0.40.99", path, b"x")
        assert status == 429 and "too many uploads at once" in body["error"], body
        assert post(port, "127.0.41.1", path, make_reports(config, [40.0])[0].to_bytes())[0] == 201
    finally:
        for s in held:
            s.close()


def test_oversize_bodies_are_charged_to_their_prefix_until_it_is_refused(task):
    """Bodies refused on their Content-Length (413, at once, unread) from addresses of one /24 each
    add one to the prefix's level: by the refusal level its new connections are answered 429, a good
    report from yet another address of it too, while another /24 is served. Before, a 413 cost
    nothing: the loop never got a 429."""
    config, port = task
    path = f"/tasks/{config.task_id}/reports"
    statuses = []
    for i in range(int(LIMITS.refuse_level) + 8):
        s = connect(port, f"127.0.42.{1 + i}")
        s.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {(64 << 10) + 1}\r\n\r\n".encode())
        answer = s.recv(200)
        s.close()
        statuses.append(answer[9:12])
        if statuses[-1] == b"429":
            break
    assert statuses[0] == b"413" and statuses[-1] == b"429", statuses
    report = make_reports(config, [40.0])[0].to_bytes()
    assert post(port, "127.0.42.250", path, report)[0] == 429
    assert post(port, "127.0.43.1", path, report)[0] == 201


def test_the_guards_refusals_are_charged(monkeypatch):
    """In process (the Guard before an app that reads its body): a malformed Content-Length (400), a
    body over its limit (413), a chunked body past its cap (411) and an upload over its prefix's own
    slots (429) each add one to the sender's level; an answered request adds nothing. (A body that
    stops coming, 408, is charged by the same line as 411: the test client cannot stall a body.)"""
    import warnings

    from dpcdf.service.server.limits import Guard

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*httpx2")
        from fastapi.testclient import TestClient

    async def echo(scope, receive, send):
        body, more = b"", True
        while more:
            message = await receive()
            body, more = body + message.get("body", b""), message.get("more_body", False)
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": body})

    limits = Limits(chunked_bytes=10, uploads_per_address=0, refused_seconds=0.01)
    failures = Failures(limits)
    client = TestClient(Guard(echo, limits=limits, failures=failures))
    cases = [(lambda: client.post("/", content=b"abc"), 200),
             (lambda: client.post("/", content=b"abc", headers={"content-length": "3x"}), 400),
             (lambda: client.post("/", content=b"x" * ((64 << 10) + 1)), 413),
             (lambda: client.post("/", content=iter([b"x" * 8] * 2)), 411),
             (lambda: client.post("/tasks/t/reports", content=b"r"), 429)]
    for charged, (call, status) in enumerate(cases):
        assert call().status_code == status
        assert failures.level("testclient") == pytest.approx(charged, abs=0.6), status
