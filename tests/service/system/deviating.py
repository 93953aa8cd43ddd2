"""A harness for a server that deviates from the protocol (issue 20), against a real server process.

- `Deviant0`: server 0 played in-process by the test (its own data dir, HPKE keys and store, through
  the real FastAPI app for registration and uploads), which holds everything an operator of server 0
  holds and sends whatever messages it likes to a real server 1 process.
- `Interceptor`: sits in front of a real server 1 (its URL is the one in the task config), so an honest
  real server 0 talks to it; with server 1's keys (`Deviant1`) a test can read every message and answer
  with chosen, re-sealed bytes: a deviating server 1.
- `recover_alphas`: the review's two-message attack, as a deviating server 0 would run it on two
  answers of server 1 to message 5 with e_0 and e_0 + delta; a positive control shows it works on the
  protocol's arithmetic, and the tests show a real server never gives the second answer.
"""
from __future__ import annotations

import http.client as http_client
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Callable
from urllib.parse import urlsplit

import numpy as np
from fastapi.testclient import TestClient

from dpcdf.service.protocols.check import round_one
from dpcdf.service.verification import randomness as RND
from dpcdf.service.client import make_reports
from dpcdf.service.hpke import ServerKeys
from dpcdf.service.http import fetch, http
from dpcdf.service.protocols.channel import PEER_HEADER, Channel, Kind
from dpcdf.service.server.app import create_app
from dpcdf.service.server.state import pair_key
from dpcdf.service.task import TaskConfig, token_hash
from dpcdf.service.wire import encode_batch
from fss import field as F

OCTETS = "application/octet-stream"
OPERATOR_ENV = "DPCDF_ADMIN_TOKEN"


def operator() -> dict:
    import os

    return {"Authorization": f"Bearer {os.environ[OPERATOR_ENV]}"}


class Deviant0:
    """Server 0 in-process, for a task with a real server 1 at `url1`."""

    URL = "http://127.0.0.1:9"  # never contacted: server 1 only answers

    def __init__(self, data: Path, url1: str):
        self.app = create_app(0, data, warm_up=False)  # it answers no query: noise as deployed
        self.client = TestClient(self.app)
        self.url1 = url1
        self.server = self.app.state.server

    def task(self, grid: dict, values: np.ndarray, mechanism: str = "tree", verify: bool | None = None) -> tuple[TaskConfig, str]:
        """Registers a task on both servers and uploads a report per value to each."""
        import secrets

        token = secrets.token_urlsafe(16)
        keys = (self.client.get("/hpke").json()["keys"]["x25519"], http("GET", f"{self.url1}/hpke")["keys"]["x25519"])
        config = TaskConfig(grid, 1.0, mechanism, "substitution", 0, (self.URL, self.url1), keys, token_hash(token),
                            verify=verify)
        body = config.to_json().encode()
        assert self.client.post("/tasks", content=body, headers=operator()).status_code == 201
        http("POST", f"{self.url1}/tasks", body, operator()["Authorization"].split()[1])
        reports = [r.to_bytes() for r in make_reports(config, values)]
        assert self.client.post(f"/tasks/{config.task_id}/reports/batch", content=encode_batch(reports)).json()["accepted"] == len(reports)
        fetch("POST", f"{self.url1}/tasks/{config.task_id}/reports/batch", encode_batch(reports), content_type=OCTETS)
        return config, token

    def state(self, config: TaskConfig):
        return self.server.task(config.task_id)

    def send_to(self, config: TaskConfig, path: str) -> Callable[[bytes], bytes]:
        """Sends a message to server 1's `path` (sync or verify) with its request tag, which server 0,
        holding the pair key, can make for any bytes (issue 42: the tag is a gate, the channel the check)."""
        channel = self.state(config).channel
        return lambda message: fetch("POST", f"{self.url1}/tasks/{config.task_id}/{path}", message, content_type=OCTETS,
                                     headers={PEER_HEADER: channel.request_header(path, message)})

    def reconcile(self, config: TaskConfig) -> None:
        """The honest reconciliation (server 0 freezes, then messages 1 and 3)."""
        st = self.state(config)
        self.server.store.freeze(config.task_id, st.set_hash)
        st.reconciliation().run(self.send_to(config, "sync"))

    def local(self, config: TaskConfig) -> round_one.Local:
        return round_one.prepare(self.state(config).ctx)

    def message_5(self, config: TaskConfig, local: round_one.Local, delta: int = 0, chunk: int = 0) -> bytes:
        """Server 0's message 5 for a chunk, its e_0 moved by `delta` (0: the honest one)."""
        from dpcdf.service.protocols.check import outcome

        part = local.chunks()[chunk]
        ours = local.message[part].copy()
        ours[:, 0] = F.add(ours[:, 0], np.full(ours.shape[0], delta, np.uint64))
        head = outcome.head(chunk, len(local.chunks()), len(local.ids), local.context)
        return self.state(config).channel.seal(Kind.CHECK_OPEN, chunk, head + ours.astype("<u8").tobytes(), local.context)

    def message_7(self, config: TaskConfig, local: round_one.Local, opened: np.ndarray, chunk: int = 0) -> bytes:
        """Server 0's message 7 (its MAC values sigma_0) for these opened elements."""
        sigma = config.check().mac_values(0, local.state, opened, local.extras)
        body = chunk.to_bytes(4, "big") + np.ascontiguousarray(sigma, "<u8").tobytes()
        return self.state(config).channel.seal(Kind.CHECK_MAC, chunk, body, local.context)

    def close(self) -> None:
        self.client.close()
        self.server.close()


def deviant_channel(config: TaskConfig, party: int, data: Path) -> Channel:
    """The channel of server `party` of this task, from its data dir's keys (no journal: seal and open)."""
    return Channel(pair_key(config, party, ServerKeys(data)), config.fingerprint, config.task_id, None,
                   "leader" if party == 0 else "helper")


def recover_alphas(config: TaskConfig, key: bytes, local0: round_one.Local, e_1: np.ndarray, v_1_shifted: np.ndarray,
                   v_0: np.ndarray, delta: int) -> np.ndarray:
    """The attack a deviating server 0 runs with ONE shifted message 5 (count task): V_1 is affine in
    the opened e with slope 2 a_1, and at the true e it is -V_0 (an honest report passes), so from
    V_1(e + delta) and its own V_0(e): a_1 = (V_1(e + delta) + V_0(e)) / (2 delta), z_1 = e_1 + a_1,
    z = z_0 + z_1 = r_alpha. Returns every report's alpha (its grid index), or -1 where z is no
    challenge."""
    rows = len(local0.ids)
    inverse = np.full(rows, pow(2 * delta, F.P - 2, F.P), np.uint64)
    a_1 = F.mul(F.add(v_1_shifted, v_0), inverse)
    z = F.add(F.add(local0.message[:, 0], local0.extras[:, 0]), F.add(e_1, a_1))  # z_0 = e_0 + a_0
    size = config.make_grid().size
    r, _ = RND.challenges(round_one.verification_key(key), b"dpcdf round one/" + config.task_id.encode(), size)
    where = {int(x): i for i, x in enumerate(r)}
    return np.array([where.get(int(x), -1) for x in z])


Rewrite = Callable[[str, bytes, int, bytes], "tuple[int, bytes] | None"]


class Interceptor:
    """A forwarding proxy before a real server 1. `rewrite(path, request, status, answer)` sees each
    exchange after server 1 answered and may return (status, bytes) to answer instead; `refuse(path,
    request)` may return a status to answer without forwarding. `log` keeps (path, request, status,
    answer sent) of every request."""

    def __init__(self, target: str):
        self.target, self.log = target, []
        self.rewrite: Rewrite | None = None
        self.refuse: Callable[[str, bytes], int | None] | None = None
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def _answer(self, status: int, data: bytes, content_type: str) -> None:
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _do(self):
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                status = proxy.refuse(self.path, body) if proxy.refuse else None
                if status is not None:
                    proxy.log.append((self.path, body, status, b""))
                    return self._answer(status, b'{"error": "interceptor: refused"}', "application/json")
                u = urlsplit(proxy.target)
                conn = http_client.HTTPConnection(u.hostname, u.port, timeout=120)
                headers = {k: v for k, v in self.headers.items() if k.lower() in ("content-type", "authorization", PEER_HEADER)}
                conn.request(self.command, self.path, body=body or None, headers=headers)
                resp = conn.getresponse()
                status, data, kind = resp.status, resp.read(), resp.getheader("Content-Type") or OCTETS
                if proxy.rewrite is not None:
                    changed = proxy.rewrite(self.path, body, status, data)
                    if changed is not None:
                        status, data = changed
                        kind = OCTETS if status == 200 else "application/json"
                proxy.log.append((self.path, body, status, data))
                self._answer(status, data, kind)

            do_GET = do_POST = _do

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
