"""Shared test helpers: the function families under test and the truth to compare against."""
from __future__ import annotations

import itertools
import os
import subprocess
import sys
import threading

import numpy as np

from fss import DCF, DPF

CMPS = ("lt", "le", "gt", "ge")


def make(kind: str, bits: int, out_bits: int, width: int, signed: bool):
    if kind == "eq":
        return DPF(bits, out_bits, width, signed=signed)
    return DCF(bits, out_bits, width, cmp=kind, signed=signed)


def truth(fn, alphas: np.ndarray, xs: np.ndarray, betas: np.ndarray) -> np.ndarray:
    """f(x) per row, straight from the definition: betas (n, width) where `x cmp alpha`, else 0."""
    a, x = alphas.astype(object), xs.astype(object)
    holds = {
        "lt": x < a, "le": x <= a, "gt": x > a, "ge": x >= a, "eq": x == a,
    }[fn.params.cmp].astype(bool)
    return np.where(holds[:, None], betas, np.uint64(0)).astype(np.uint64)


def as_rows(fn, shares: np.ndarray) -> np.ndarray:
    """(n,) or (n, width) shares -> (n, width)."""
    return shares.reshape(shares.shape[0], fn.width)


def add(fn, y0: np.ndarray, y1: np.ndarray) -> np.ndarray:
    return (y0 + y1) & np.uint64(fn.params.mask)


def null_rejections(release, plain_statistic, n: int, runs: int, seed: int) -> tuple[float, float, float]:
    """Rejection rates at the 5% level over `runs` calibrated data sets (p ~ Beta(2, 2), y ~ Bernoulli(p)),
    10 groups: (the release's noise-aware p-value, its p-value of the noisy H, the plain HL test on the
    same data). `release(p, y)` gives a DP Hosmer-Lemeshow result, `plain_statistic(p, y, result)` H."""
    from scipy import stats

    rng = np.random.default_rng(seed)  # the test's data only
    rejected = []
    for _ in range(runs):
        p = rng.beta(2, 2, n)
        y = (rng.random(n) < p).astype(int)
        r = release(p, y)
        rejected.append((r.noise_aware_p_value < 0.05, r.p_value < 0.05, stats.chi2.sf(plain_statistic(p, y, r), 8) < 0.05))
    return tuple(np.mean(rejected, axis=0))


def miscalibrated(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Predicted p ~ Beta(2, 2) for labels drawn with probability sqrt(p): a model that a calibration
    test must reject."""
    rng = np.random.default_rng(seed)  # the test's data only
    p = rng.beta(2, 2, n)
    return p, (rng.random(n) < np.sqrt(p)).astype(int)


# --- the two-server system tests -----------------------------------------------------------------
GRID = {"kind": "uniform", "lo": 0.0, "hi": 100.0, "bits": 6}
TESTING = {"DPCDF_TESTING": "1"}
OPERATOR = os.environ["DPCDF_ADMIN_TOKEN"]  # set by conftest: the operator token of every test server


def dpcdf_cli(*args: str) -> subprocess.CompletedProcess:
    """`python -m dpcdf ARGS` as a user runs it (a real process, the test servers' settings)."""
    env = dict(os.environ, **TESTING)
    return subprocess.run([sys.executable, "-m", "dpcdf", *args], capture_output=True, text=True, timeout=300, env=env)


def values(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).uniform(0, 100, n)  # the simulated data only


def urls(pair) -> list[str]:
    return [url for _, url, _ in pair]


def neighbour_prefixes(size: int, relation: str):
    """(prefix, prefix') for every neighbour pair of one-value data sets on `size` grid points (a common
    background cancels in any linear release's differences): substitution moves the value from leaf a
    to leaf c; add/remove adds it at leaf a."""
    if relation == "substitution":
        for a, c in itertools.product(range(size), repeat=2):
            x, y = np.zeros(size, np.int64), np.zeros(size, np.int64)
            x[a], y[c] = 1, 1
            yield np.cumsum(x), np.cumsum(y)
    else:
        for a in range(size):
            x = np.zeros(size, np.int64)
            x[a] = 1
            yield np.zeros(size, np.int64), np.cumsum(x)


def served_task(tmp_path, server1_key: str, grid: dict, verify: bool = False):
    """A server 0 app (in-process, FastAPI's TestClient) with one registered task that names
    `server1_key` (hex) as server 1's HPKE key: (app, client, config)."""
    import warnings

    from dpcdf.service.server import create_app
    from dpcdf.service.task import TaskConfig, token_hash

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*httpx2")
        from fastapi.testclient import TestClient

    app = create_app(0, tmp_path, warm_up=False, sweep_every=1e9)
    client = TestClient(app)
    pub = client.get("/hpke").json()["keys"]["x25519"]
    config = TaskConfig(grid, 1.0, "path", "substitution", 1, ("a", "b"), (pub, server1_key), token_hash("t"), verify=verify)
    assert client.post("/tasks", content=config.to_json(), headers={"authorization": f"Bearer {OPERATOR}",
                                                                    "content-type": "application/json"}).status_code == 201
    return app, client, config


def v1_report(config, report_id: bytes, shares: tuple[bytes, bytes]):
    """A format 1 report (an earlier release's client: one HPKE seal per share) of these shares."""
    from dpcdf.service import hpke
    from dpcdf.service.wire import Report, hpke_info

    sealed = []
    for party, (pub, share) in enumerate(zip(config.hpke_keys, shares)):
        out = hpke.suite("x25519").encrypt(share, hpke.public_key("x25519", pub), info=hpke_info(config.fingerprint, report_id, party))
        sealed.append((out[:32], out[32:]))
    return Report(config.fingerprint, report_id, (sealed[0], sealed[1]), version=1)


def adaptive_v5(*args, **kwargs):
    """An `AdaptiveMechanism` with plan version 5's rules and share rule 2 (the default before version 6),
    unless the call names others: the tests of those versions' planning pin them."""
    from dpcdf.release.adaptive import AdaptiveMechanism

    return AdaptiveMechanism(*args, **{"plan_version": 5, "share_rule": 2, **kwargs})


def peer_post(client, channel, path: str, message: bytes):
    """POSTs `message` to server 1's `path` (/tasks/{id}/sync or /verify) through `client` (FastAPI's
    TestClient) with server 0's request tag (the Dpcdf-Peer header, issue 42), made with `channel` (either
    server's channel of the task: both derive the one pair key), as server 0, honest or deviating, sends it."""
    from dpcdf.service.protocols.channel import PEER_HEADER

    endpoint = path.rsplit("/", 1)[1]
    return client.post(path, content=message, headers={PEER_HEADER: channel.request_header(endpoint, message)})


async def echo_app(scope, receive, send):
    """An ASGI app that answers 200 with the request's whole body (what the guard's tests wrap)."""
    body, more = b"", True
    while more:
        message = await receive()
        body, more = body + message.get("body", b""), message.get("more_body", False)
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": body})


def send_each_second(socks: list, data: bytes, stop: threading.Event) -> threading.Thread:
    """A started daemon thread that sends `data` on every socket of `socks` once a second until `stop` is
    set (a socket the server closed is skipped): held connections that never go idle long enough to be
    dropped (a trickled body, a keep-alive asked again)."""
    def run() -> None:
        while not stop.wait(1.0):
            for s in socks:
                try:
                    s.send(data)
                except OSError:
                    pass

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread
