"""Retention on real server processes (issue 24): a verified task's key shares are deleted once its
release is final and it gives the same answers after, across restarts; a delete interrupted by a crash
between its transaction and its files is finished at the next start; a task past --retention is
expired: its analyst gets 410, its reports are gone."""
import time

import numpy as np
import pytest

from dpcdf.analyst import Analyst
from dpcdf.service.client import create_task, make_reports, submit
from dpcdf.service.http import ServerError, http
from dpcdf.service.processes import free_port, start_server, stop
from dpcdf.service.server.housekeeping import CRASH_ENV
from dpcdf.service.storage.segments import task_dir
from helpers import GRID, OPERATOR, TESTING, values

QUIET = ["--sweep-every", "3600"]  # the sweep runs at the start, then when the test asks


def _listing(url):
    return {t["task_id"]: t for t in http("GET", f"{url}/admin/tasks", token=OPERATOR)["tasks"]}


def _sweep(url):
    return http("POST", f"{url}/admin/retention", token=OPERATOR)["purged"]


def _wait(condition, seconds=20.0):
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("timed out")
        time.sleep(0.2)


def test_released_tasks_answer_the_same_and_an_interrupted_delete_finishes_after_a_restart(tmp_path):
    data = [str(tmp_path / f"s{p}") for p in (0, 1)]
    ports = [free_port(), free_port()]
    s0 = start_server(0, data[0], port=ports[0], extra_env=TESTING, args=QUIET)[0]
    s1 = start_server(1, data[1], port=ports[1], extra_env={**TESTING, CRASH_ENV: "1"}, args=QUIET)[0]
    urls = [f"http://127.0.0.1:{p}" for p in ports]
    try:
        verified, vtoken = create_task(urls, GRID, 1.0, "tree", "substitution", min_batch=1)
        plain, ptoken = create_task(urls, GRID, 1.0, "tree", "substitution", min_batch=1, verify=False)
        assert verified.verify and not plain.verify
        for config in (verified, plain):
            submit(config, values(150, 3))
        idx = list(range(64))
        before = Analyst(verified, vtoken).prefix_counts(idx)[0]
        Analyst(plain, ptoken).prefix_counts(idx)
        assert all(task_dir(d, plain.task_id).is_dir() for d in data)  # its segments, on both servers
        assert _listing(urls[0])[verified.task_id]["stored"] == 150
        purged = _sweep(urls[0])  # server 0: the verified task is released, the unverified one is not
        assert [(p["task_id"], p["reason"], p["reports"]) for p in purged] == [(verified.task_id, "released", 150)]
        row = _listing(urls[0])[verified.task_id]
        assert row["state"] == "released" and row["stored"] == 0 and row["histogram"] and row["counted"] == 150
        np.testing.assert_array_equal(Analyst(verified, vtoken).prefix_counts(idx)[0], before)
        with pytest.raises(ServerError):  # server 1 crashes between the delete's transaction and its files
            http("DELETE", f"{urls[1]}/admin/tasks/{plain.task_id}", token=OPERATOR)
        assert s1.wait(10) == 3
        assert task_dir(data[1], plain.task_id).is_dir()  # files left behind by the crash
        s1 = start_server(1, data[1], port=ports[1], extra_env=TESTING, args=QUIET)[0]
        _wait(lambda: not task_dir(data[1], plain.task_id).exists())  # the start's sweep removes them
        rows = _listing(urls[1])
        assert rows[plain.task_id]["state"] == "deleted" and rows[plain.task_id]["stored"] == 0
        assert rows[verified.task_id]["state"] == "released"  # and released the verified task here too
        with pytest.raises(ServerError, match="410"):
            Analyst(plain, ptoken).prefix_counts(idx)
        stop(s0)
        s0 = start_server(0, data[0], port=ports[0], extra_env=TESTING, args=QUIET)[0]
        np.testing.assert_array_equal(Analyst(verified, vtoken).prefix_counts(idx)[0], before)
        assert _sweep(urls[0]) == [] and _sweep(urls[1]) == []  # nothing left to do
    finally:
        for proc in (s0, s1):
            stop(proc)


def test_a_task_past_the_retention_is_expired(tmp_path):
    args = ["--retention", "3s", "--sweep-every", "0.5"]
    procs = [start_server(p, str(tmp_path / f"s{p}"), extra_env=TESTING, args=args) for p in (0, 1)]
    urls = [u for _, u in procs]
    try:
        config, token = create_task(urls, GRID, 1.0, "tree", "substitution", min_batch=1)
        submit(config, values(40, 5))
        assert all(_listing(u)[config.task_id]["stored"] == 40 for u in urls)
        _wait(lambda: all(_listing(u)[config.task_id]["state"] == "expired" for u in urls))
        assert all(_listing(u)[config.task_id]["stored"] == 0 for u in urls)
        with pytest.raises(ServerError, match="410 task .* is expired"):
            Analyst(config, token).close()
        late = make_reports(config, [50.0])[0].to_bytes()
        with pytest.raises(ServerError, match="409 collection is closed"):  # uploads: its collection is closed
            http("POST", f"{urls[0]}/tasks/{config.task_id}/reports", late, content_type="application/octet-stream")
        with pytest.raises(ServerError, match="401"):  # without its token: as for an unknown task
            http("GET", f"{urls[0]}/tasks/{config.task_id}", token="made-up")
        text = http_text(urls[0])
        assert 'dpcdf_retention_purged_total{reason="expired"} 1' in text
    finally:
        for proc, _ in procs:
            stop(proc)


def http_text(url):
    from dpcdf.service.http import fetch

    return fetch("GET", f"{url}/metrics", token=OPERATOR).decode()
