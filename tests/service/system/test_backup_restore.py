"""`dpcdf admin backup` while the servers run, and a restore (issue 24): fresh server processes on the
backups, at the task configs' URLs, give the same answers to the same queries (a verified task, from
its histogram share; an unverified one, from its segments), and the backups match their manifests."""
import subprocess
import sys
import threading

import numpy as np

from dpcdf.analyst import Analyst
from dpcdf.service.client import create_task, submit
from dpcdf.service.processes import free_port, start_server, stop
from dpcdf.service.storage.backup import check
from helpers import GRID, TESTING, values


def _dpcdf(*args):
    run = subprocess.run([sys.executable, "-m", "dpcdf", *args], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    return run.stdout


def test_a_backup_made_while_serving_restores_to_the_same_answers(tmp_path):
    ports = [free_port(), free_port()]
    data = [str(tmp_path / f"s{p}") for p in (0, 1)]
    procs = [start_server(p, data[p], port=ports[p], extra_env=TESTING)[0] for p in (0, 1)]
    urls = [f"http://127.0.0.1:{p}" for p in ports]
    try:
        verified, vtoken = create_task(urls, GRID, 1.0, "tree", "substitution", min_batch=1)
        plain, ptoken = create_task(urls, GRID, 1.0, "tree", "substitution", min_batch=1, verify=False)
        busy, _ = create_task(urls, GRID, 1.0, "tree", "substitution", min_batch=1)
        for config in (verified, plain):
            submit(config, values(120, 11))
        idx = list(range(0, 64, 3))
        answers = {c.task_id: Analyst(c, t).prefix_counts(idx) for c, t in ((verified, vtoken), (plain, ptoken))}
        uploading = threading.Thread(target=submit, args=(busy, values(3000, 12)), kwargs={"batch": 100})
        uploading.start()  # the servers are writing while they are backed up
        try:
            printed = [_dpcdf("admin", "backup", "--data", data[p], "--to", str(tmp_path / f"b{p}")) for p in (0, 1)]
        finally:
            uploading.join()
        assert all("3 tasks" in line for line in printed)
        for p in (0, 1):
            assert "server.sqlite" in check(tmp_path / f"b{p}")["files"]
            assert "files match the manifest" in _dpcdf("admin", "check-backup", str(tmp_path / f"b{p}"))
        listing = _dpcdf("admin", "tasks", "--server", urls[0])
        assert verified.task_id in listing and busy.task_id in listing
    finally:
        for proc in procs:
            stop(proc)
    procs = [start_server(p, str(tmp_path / f"b{p}"), port=ports[p], extra_env=TESTING)[0] for p in (0, 1)]
    try:
        for config, token in ((verified, vtoken), (plain, ptoken)):
            counts, n = Analyst(config, token).prefix_counts(idx)
            np.testing.assert_array_equal(counts, answers[config.task_id][0])
            assert n == answers[config.task_id][1] == 120
    finally:
        for proc in procs:
            stop(proc)
