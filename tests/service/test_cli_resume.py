"""The path a user takes after an error: a server killed (SIGKILL) during `dpcdf submit`, restarted on
the same data directory, and the same command run again. Every value must count exactly once."""
import csv
import json
import os
import re
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from dpcdf.analyst import Analyst
from dpcdf.release.ecdf import prefix_counts
from dpcdf.service.http import ServerError, http
from dpcdf.service.processes import free_port, start_server, stop
from dpcdf.service.task import TaskConfig
from helpers import TESTING

N = 3000


def dpcdf(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dpcdf", *args], capture_output=True, text=True, timeout=timeout,
                          env=dict(os.environ, **TESTING))


def stored(url: str, task_id: str, token: str) -> int:
    try:
        return http("GET", f"{url}/tasks/{task_id}", token=token, timeout=2)["reports"]
    except ServerError:
        return -1


@pytest.mark.parametrize("victim", [1, 0])
def test_kill_a_server_during_submit_then_rerun_the_same_command(tmp_path, victim):
    ports = [free_port(), free_port()]
    servers = [start_server(p, str(tmp_path / f"server{p}"), port=ports[p], noise=False, extra_env=TESTING) for p in (0, 1)]
    try:
        urls = [u for _, u in servers]
        task = tmp_path / "task.json"
        made = dpcdf("task", "--servers", *urls, "--grid", "uniform:0:100:8", "--epsilon", "1", "--mechanism", "tree",
                     "--min-batch", "10", "--out", str(task))
        assert made.returncode == 0, made.stderr
        config, token = TaskConfig.from_json(task.read_text()), (tmp_path / "task.json.token").read_text()
        vals = np.random.default_rng(7).uniform(0, 100, N)  # the simulated data only
        data = tmp_path / "values.csv"
        with open(data, "w", newline="") as f:
            csv.writer(f).writerows([["value"]] + [[repr(float(v))] for v in vals])
        command = ["submit", "--task", str(task), "--csv", str(data), "--batch", "100", "--retry-for", "2"]

        upload = subprocess.Popen([sys.executable, "-m", "dpcdf", *command], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  text=True, env=dict(os.environ, **TESTING))
        deadline = time.monotonic() + 120
        while stored(urls[victim], config.task_id, token) < 600 and time.monotonic() < deadline:
            time.sleep(0.02)
        servers[victim][0].send_signal(signal.SIGKILL)
        servers[victim][0].wait()
        at_kill = int(sqlite_count(tmp_path / f"server{victim}" / "server.sqlite"))
        out, err = upload.communicate(timeout=300)
        assert 600 <= at_kill < N, "the kill came after the upload ended: the test proved nothing"
        assert upload.returncode != 0 and "run the same command again" in err, err
        assert set(re.findall(r"\d+/(\d+) reports on both servers", err)) == {str(N)}, err  # the whole input's total throughout
        # which server failed, as it happened and at the end (before: a silent wait of --retry-for seconds)
        assert f"note: server {victim}: " in err and "retrying for 2 s (--retry-for)" in err, err
        assert f"(server {victim} did not answer for 2 s: " in err.splitlines()[-1], err
        pending = json.loads(out.strip().splitlines()[-1])
        assert pending["pending"] > 0 and pending["rows"] == N

        servers[victim] = start_server(victim, str(tmp_path / f"server{victim}"), port=ports[victim], noise=False,
                                       extra_env=TESTING)
        again = dpcdf(*command)
        assert again.returncode == 0, again.stderr
        assert json.loads(again.stdout.strip().splitlines()[-1])["complete"] == N

        analyst = Analyst(config, token)
        assert analyst.close() == N  # both servers hold exactly the N reports: none twice, none one-sided
        grid = config.make_grid()
        counts, n = analyst.prefix_counts(range(grid.size))
        np.testing.assert_array_equal(counts, prefix_counts(vals, grid))  # every value counted exactly once
        assert analyst.release().total == N
    finally:
        for proc, _ in servers:
            if proc.poll() is None:
                stop(proc)


def sqlite_count(path) -> int:
    """Reports the killed server had committed (read from its file, as it would restart with)."""
    import sqlite3

    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return db.execute("SELECT COUNT(*) FROM reports").fetchone()[0]
    finally:
        db.close()
