"""Starting real server processes on loopback (the demo and the tests use these)."""
from __future__ import annotations

import os
import secrets
import socket
import subprocess
import sys
import time

from .http import ServerError, http


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(party: int, data_dir: str, port: int | None = None, noise: bool = True, log=None,
                 extra_env: dict | None = None, args: list[str] | None = None) -> tuple[subprocess.Popen, str]:
    """`python -m dpcdf serve` as a child process; returns it and its URL once /health answers.
    Servers started from one process share one operator token: $DPCDF_ADMIN_TOKEN, set here to a
    fresh random one if absent, which `create_task` then uses."""
    os.environ.setdefault("DPCDF_ADMIN_TOKEN", secrets.token_urlsafe(32))
    port = port or free_port()
    cmd = [sys.executable, "-m", "dpcdf", "serve", "--party", str(party), "--port", str(port), "--data", data_dir]
    env = dict(os.environ, **(extra_env or {}))
    if not noise:
        cmd.append("--no-noise")
    cmd += args or []
    proc = subprocess.Popen(cmd, stdout=log or subprocess.DEVNULL, stderr=log or subprocess.DEVNULL, env=env)
    url = f"{'https' if '--tls-cert' in cmd else 'http'}://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise ServerError(f"server {party} exited with status {proc.returncode}")
        try:
            http("GET", f"{url}/health", timeout=2)
            return proc, url
        except ServerError:
            time.sleep(0.1)
    proc.kill()
    raise ServerError(f"server {party} did not answer within 60 s")


def stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
