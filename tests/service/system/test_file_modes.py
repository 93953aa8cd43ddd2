"""Every file a server writes is its owner's only (issue 20): after full tasks on real server processes
(reports, close, query; a verified task and an unverified one, whose key shares go to segments), every
file under each server's data directory is 0600 (no bit for group or others) and every folder 0700."""
from __future__ import annotations

import os
import stat

from dpcdf.analyst import Analyst
from dpcdf.service.client import create_task, submit
from helpers import GRID, urls, values


def test_every_file_a_server_writes_is_0600_in_0700_folders(servers):
    procs, _ = servers
    pair = procs["exact"]
    for verify in (False, True):
        config, token = create_task(urls(pair), GRID, 1.0, "tree", "substitution", min_batch=1, verify=verify)
        assert submit(config, values(60, seed=3), batch=25)["complete"] == 60
        analyst = Analyst(config, token)
        analyst.close()
        assert analyst.release().ecdf([50.0]).shape == (1,)
    seen = {"files": 0, "folders": 0, "segments": 0}
    for _, _, data in pair:
        assert stat.S_IMODE(os.stat(data).st_mode) == 0o700, data
        for root, folders, files in os.walk(data):
            for name in folders:
                mode = stat.S_IMODE(os.stat(os.path.join(root, name)).st_mode)
                assert mode == 0o700, f"{os.path.join(root, name)}: {mode:o}"
                seen["folders"] += 1
            for name in files:
                mode = stat.S_IMODE(os.lstat(os.path.join(root, name)).st_mode)
                assert mode & 0o077 == 0 and mode & 0o600 == 0o600, f"{os.path.join(root, name)}: {mode:o}"
                seen["files"] += 1
                seen["segments"] += name.endswith(".npy")
    # the walk saw what a server writes: the store, keys, segments of the unverified task, their folders
    assert seen["segments"] >= 2 and seen["folders"] >= 4 and seen["files"] >= 8, seen
