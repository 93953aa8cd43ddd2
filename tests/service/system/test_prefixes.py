"""Budgets per address prefix (issue 42, item 2): uploads in flight, declared bytes, failures and
connections count per IPv4 /24 (IPv6 /64), not per address, so an attacker's neighbouring addresses
share one budget; and the Guard's own refusals (408, 411, 413, a 400 Content-Length, 429 over the
prefix's own budget) are charged to the prefix. Each test uses a /24 of its own (127.0.4x.y); on the
code before, the same tests fail: each address had a budget of its own and those refusals cost nothing.

Then the rest of item 2 (each failing on cee9256): a body's bytes count as they arrive, with a minimum
pace; a keep-alive connection's requests and age are capped; requests with a key (server 0's request
tag, the analyst's or the operator's token) pass a crowded or refused prefix, and the analyst's close
succeeds while server 0's own /24 floods both servers (on servers of its own: it gets 127.0.0.0/24,
which the other tests' clients use, refused); `dpcdf serve --client-prefix-v4/--client-prefix-v6`."""
from __future__ import annotations

import http.client as httpc
import socket
import threading
import time

import numpy as np
import pytest

from dpcdf.analyst import Analyst
from dpcdf.service.client import create_task, make_reports
from dpcdf.service.processes import start_server, stop
from dpcdf.service.server.limits import Failures, Limits, prefix_of
from dpcdf.service.wire import encode_batch
from helpers import GRID, OPERATOR, TESTING, echo_app, send_each_second, urls
from test_exhaustion import JUNK, LIMITS, SLACK, connect, post


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

    echo = echo_app

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


# --- issue 42, item 2 (the rest): a body's pace, keep-alive caps, room kept for keys, the serve flags ----------
def _get(port: int, source: str, path: str, headers: dict | None = None) -> tuple[int, float, dict]:
    """One GET on a fresh connection from `source`: (status, seconds to the answer, headers); status 0 if
    the connection closed without one."""
    conn = httpc.HTTPConnection("127.0.0.1", port, timeout=30, source_address=(source, 0))
    t = time.monotonic()
    try:
        conn.request("GET", path, headers=headers or {})
        resp = conn.getresponse()
        resp.read()
        return resp.status, time.monotonic() - t, dict(resp.getheaders())
    except (OSError, httpc.HTTPException):
        return 0, time.monotonic() - t, {}
    finally:
        conn.close()


def test_a_body_below_the_minimum_rate_is_dropped_after_its_grace(task):
    """A batch whose body trickles a byte every 0.5 s (never a pause of 5 s) is dropped with 408 once its
    grace is spent (2 s: bytes count as they arrive, at least 16 KiB/s after it), not held its whole 10 s;
    a batch of real reports sent at about 20 KiB/s is read whole and stored. Before, one byte per 5 s kept
    a body for its 10 s."""
    config, port = task
    path = f"/tasks/{config.task_id}/reports/batch"
    s = connect(port, "127.0.44.1")
    s.settimeout(0.5)
    s.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: 60000\r\n\r\n".encode())
    t, answer = time.monotonic(), b""
    while time.monotonic() - t < LIMITS.body_seconds + SLACK:
        try:
            chunk = s.recv(4096)
        except socket.timeout:
            try:
                s.send(b"x")
            except OSError:
                break
            continue
        except OSError:
            break
        if not chunk:
            break
        answer += chunk
    waited = time.monotonic() - t
    s.close()
    assert waited < LIMITS.body_grace + SLACK, (waited, answer[:300])
    assert answer.startswith(b"HTTP/1.1 408") and b"bytes/s or more" in answer, answer[:300]
    body = encode_batch([r.to_bytes() for r in make_reports(config, np.linspace(1, 99, 40))])
    s = connect(port, "127.0.44.2")
    s.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n\r\n".encode())
    for i in range(0, len(body), 4096):  # 4 KiB every 0.2 s
        time.sleep(0.2)
        s.sendall(body[i : i + 4096])
    answer = b""
    while b"}" not in answer:  # the answer's JSON body, whole
        chunk = s.recv(4096)
        if not chunk:
            break
        answer += chunk
    s.close()
    assert answer.startswith(b"HTTP/1.1 200") and b'"accepted":40' in answer.replace(b" ", b""), (len(body), answer[:300])


def test_a_keep_alive_connection_is_closed_after_its_requests(task):
    """The answer to a connection's `keepalive_requests`-th request says Connection: close and the server
    closes it (before: any number of requests on one connection, each resetting its 5 s)."""
    _, port = task
    conn = httpc.HTTPConnection("127.0.0.1", port, timeout=30, source_address=("127.0.45.1", 0))
    closing = []
    for _ in range(LIMITS.keepalive_requests):
        conn.request("GET", "/health")
        resp = conn.getresponse()
        resp.read()
        closing.append(resp.getheader("connection") == "close")
    assert closing == [False] * (LIMITS.keepalive_requests - 1) + [True]
    assert conn.sock is None or conn.sock.recv(1) == b""
    conn.close()


def test_a_keep_alive_connection_is_closed_at_its_age(tmp_path):
    """Over `keepalive_seconds` (1 s here: uvicorn in a thread, with the server's protocol and these
    limits), the next answer says Connection: close and the connection closes."""
    import uvicorn

    from dpcdf.service.server import create_app
    from dpcdf.service.server.connections import uvicorn_options

    app = create_app(0, tmp_path / "s0", warm_up=False, sweep_every=1e9, limits=Limits(keepalive_seconds=1.0))
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", **uvicorn_options(app)))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 30
        while not server.started and time.monotonic() < deadline:
            time.sleep(0.05)
        conn = httpc.HTTPConnection("127.0.0.1", sock.getsockname()[1], timeout=30)
        answers = []
        for pause in (0.0, 0.3, 1.0):
            time.sleep(pause)
            conn.request("GET", "/health")
            resp = conn.getresponse()
            resp.read()
            answers.append(resp.getheader("connection"))
        assert answers == [None, None, "close"], answers
        conn.close()
    finally:
        server.should_exit = True
        thread.join(10)


def _crowd(port: int, net: str, count: int, read: bool = True) -> list[socket.socket]:
    """`count` keep-alive connections from addresses of `net`.x (x from 100), each asked GET /health once
    (and its answer read, if `read`)."""
    socks = []
    for i in range(count):
        s = connect(port, f"{net}.{100 + i}")
        s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        socks.append(s)
    for s in socks if read else ():
        s.settimeout(10)
        try:
            s.recv(4096)
        except OSError:
            pass  # (closed at once over the cap, on the code before)
    return socks


def _keyed_requests(port: int, net: str, config, token: str, tag: str) -> dict[str, tuple[int, float]]:
    """The answers (status, seconds) to requests from fresh addresses of `net`: without a key, with a
    wrong bearer token, the analyst's, the operator's, and server 0's request tag on a /verify (409 for
    this unverified task: the tag is right)."""
    from concurrent.futures import ThreadPoolExecutor

    task_path = f"/tasks/{config.task_id}"
    asks = (("no key", "/health", {}),
            ("wrong token", task_path, {"Authorization": "Bearer not-the-analysts-token-at-all"}),
            ("analyst", task_path, {"Authorization": f"Bearer {token}"}),
            ("operator", "/health/operator", {"Authorization": f"Bearer {OPERATOR}"}))
    with ThreadPoolExecutor(len(asks)) as pool:  # side by side: the refused ones wait their 5 s together
        answers = list(pool.map(lambda i: _get(port, f"{net}.{10 + i}", asks[i][1], asks[i][2]), range(len(asks))))
    out = {name: (status, took) for (name, _, _), (status, took, _) in zip(asks, answers)}
    s = connect(port, f"{net}.20")
    t = time.monotonic()
    s.sendall(f"POST {task_path}/verify HTTP/1.1\r\nHost: x\r\nContent-Type: application/octet-stream\r\n"
              f"Content-Length: 41\r\nDpcdf-Peer: {tag}\r\n\r\n".encode() + JUNK["verify"])
    s.settimeout(10)
    try:
        answer = s.recv(4096)
    except OSError:
        answer = b""
    out["server 0's tag"] = (int(answer[9:12]) if answer[:5] == b"HTTP/" else 0, time.monotonic() - t)
    s.close()
    return out


def _check_keyed(answers: dict[str, tuple[int, float]]) -> None:
    for name in ("no key", "wrong token"):
        status, took = answers[name]
        assert status == 429 and LIMITS.probation_seconds - 0.2 <= took < LIMITS.probation_seconds + SLACK, answers
    assert answers["analyst"][0] == 200 and answers["operator"][0] == 200, answers
    assert answers["server 0's tag"][0] == 409, answers
    assert max(answers[k][1] for k in ("analyst", "operator", "server 0's tag")) < 0.9, answers  # at once


@pytest.fixture(scope="module")
def tagged(servers):
    """Server 1 of the shared pair, an unverified task on it, its analyst token, and server 0's request
    tag for a junk /verify (made with server 0's keys, as `deviating` does)."""
    from deviating import deviant_channel

    procs, _ = servers
    pair = procs["exact"]
    config, token = create_task(urls(pair), GRID, 1.0, "tree", "substitution", min_batch=1, verify=False)
    tag = deviant_channel(config, 0, pair[0][2]).request_header("verify", JUNK["verify"])
    return config, token, tag, int(pair[1][1].rsplit(":", 1)[1])


def test_requests_with_a_key_pass_a_crowded_prefix(tagged):
    """127.0.46.0/24 holds its 32 connections: a request without a key (or with a wrong token) from
    another address of it is held 5 s and answered 429; the analyst's, the operator's and server 0's
    tagged message (from addresses that are not server 0's) pass at once, in the reserved room. Before,
    a 33rd connection was closed at once, unanswered, whoever sent it."""
    config, token, tag, port = tagged
    socks = _crowd(port, "127.0.46", LIMITS.connections_per_address)
    try:
        _check_keyed(_keyed_requests(port, "127.0.46", config, token, tag))
    finally:
        for s in socks:
            s.close()


def test_requests_with_a_key_pass_a_refused_prefix(tagged):
    """127.0.47.0/24 refused for its 413s: its requests without a key are held 5 s and answered 429 (the
    tarpit), while the analyst's, the operator's and server 0's tagged message pass at once. Before,
    every connection of a refused prefix was held 1 s unread and answered 429."""
    config, token, tag, port = tagged
    for i in range(int(LIMITS.refuse_level) + 8):
        status, _, _ = post(port, f"127.0.47.{100 + i}", f"/tasks/{config.task_id}/reports", bytes((64 << 10) + 1))
        if status == 429:
            break
    assert status == 429
    _check_keyed(_keyed_requests(port, "127.0.47", config, token, tag))


def test_the_close_succeeds_while_server_0s_prefix_is_flooded(tmp_path):
    """The /24 of server 0 and of the analyst (127.0.0.0/24) attacks both servers: 48 keep-alive
    connections each (16 over the cap, held), and 16 slow bodies each (over the cap too). An honest
    upload from another /24 is taken, and the analyst's close succeeds: its requests carry its token,
    server 0's messages to server 1 their tag (and come from the address the task names for server 0),
    while a request without a key from that /24 is refused (429). Before, the analyst's connections and
    server 0's were closed at once, unanswered: the prefix was at its cap."""
    from concurrent.futures import ThreadPoolExecutor

    procs = [start_server(p, str(tmp_path / f"s{p}"), noise=False, extra_env=TESTING) for p in (0, 1)]
    socks, stopping = [], threading.Event()
    try:
        ports = [int(u.rsplit(":", 1)[1]) for _, u in procs]
        config, token = create_task([u for _, u in procs], GRID, 1.0, "tree", "substitution", min_batch=1, verify=False)
        body = encode_batch([r.to_bytes() for r in make_reports(config, np.linspace(1, 99, 12))])
        for port in ports:
            assert post(port, "127.0.0.1", f"/tasks/{config.task_id}/reports/batch", body)[0] == 200
            socks += _crowd(port, "127.0.0", LIMITS.connections_per_address + 16, read=False)
            for i in range(16):
                s = connect(port, f"127.0.0.{200 + i}")
                s.sendall(f"POST /tasks/{config.task_id}/reports HTTP/1.1\r\nHost: x\r\nContent-Length: 60000\r\n\r\nx".encode())
                socks.append(s)

        send_each_second(socks, b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n", stopping)  # their 5 s keep-alive never runs out
        time.sleep(0.5)
        with ThreadPoolExecutor(1) as pool:
            keyless = pool.submit(_get, ports[0], "127.0.0.99", "/health")  # held 5 s meanwhile
            honest = make_reports(config, [50.0])[0].to_bytes()
            assert [post(port, "127.0.9.1", f"/tasks/{config.task_id}/reports", honest)[0] for port in ports] == [201, 201]
            assert Analyst(config, token).close() == 13
            assert keyless.result()[0] in (0, 429)  # the prefix is full (0: closed at once, before)
    finally:
        stopping.set()
        for s in socks:
            s.close()
        for proc, _ in procs:
            stop(proc)


def test_serve_takes_the_prefix_lengths(tmp_path, monkeypatch, capsys):
    """dpcdf serve --client-prefix-v4/--client-prefix-v6 set the budgets' prefixes; a length out of range
    is refused (exit 2) before anything starts."""
    from dpcdf import cli
    from dpcdf.service import server

    seen = {}
    monkeypatch.setattr(server, "serve", lambda *a, **k: seen.update(k))
    base = ["serve", "--party", "0", "--port", "1", "--data", str(tmp_path)]
    assert cli.main(base) in (0, None) and (seen["limits"].prefix_v4, seen["limits"].prefix_v6) == (24, 64)
    assert cli.main(base + ["--client-prefix-v4", "32", "--client-prefix-v6", "48"]) in (0, None)
    assert (seen["limits"].prefix_v4, seen["limits"].prefix_v6) == (32, 48)
    assert cli.main(base + ["--client-prefix-v4", "33"]) == 2
    assert "--client-prefix-v4 must be a prefix length from 8 to 32" in capsys.readouterr().err
