"""Issue 42, item 4: front-running a report id. Whoever learns a report's id before its upload reaches
a server (a deviating other server that got the batch first, a logging proxy) can store a well-formed
report of its own under it. The server must then answer the honest upload "report id taken by other
content", never "duplicate" (which the client takes as acknowledged: the report was silently lost at
the close). The same bytes sent again (a spool resumed after a crash) stay acknowledged."""
import csv
import json
import sqlite3

import numpy as np
import pytest

from dpcdf.analyst import Analyst
from dpcdf.release.ecdf import prefix_counts
from dpcdf.service.client import data_holder
from dpcdf.service.client.data_holder import make_reports
from dpcdf.service.http import ServerError, fetch, http
from dpcdf.service.processes import free_port, start_server, stop
from dpcdf.service.task import TaskConfig
from dpcdf.service.wire import TAKEN, encode_batch
from helpers import GRID, OPERATOR, TESTING, dpcdf_cli, urls, values

BINARY = "application/octet-stream"


def impostors(config: TaskConfig, ids: list[bytes], vals) -> list[bytes]:
    """Well-formed reports of the attacker's own values under the given report ids (what the attacker
    makes once it learned them: `make_reports` with its id draw replaced)."""
    real = data_holder.report_ids
    data_holder.report_ids = lambda n: b"".join(ids[:n])
    try:
        made = make_reports(config, vals)
    finally:
        data_holder.report_ids = real
    assert [r.report_id for r in made] == ids[:len(vals)]
    return [r.to_bytes() for r in made]


@pytest.mark.parametrize("party", [0, 1])
def test_only_the_same_bytes_are_a_duplicate_on_either_server(servers, party):
    """On each server (each stores its own share): an id taken by other content is 409 for one upload
    and a conflict in a batch (in `rejected` at its index, counted in `conflicts`, not in
    `duplicates`), while the same bytes again are a duplicate. Before issue 42 the honest upload was
    answered "duplicate" (`duplicates: 2`), which acknowledges it."""
    procs, _ = servers
    pair = urls(procs["exact"])
    config, token = data_holder.create_task(pair, GRID, 1.0, "path", "substitution", min_batch=1, verify=False)
    made = make_reports(config, values(4, 11))
    honest = [r.to_bytes() for r in made]
    fake = impostors(config, [r.report_id for r in made[:2]], [99.0, 99.0])
    url = f"{pair[party]}/tasks/{config.task_id}/reports"
    assert http("POST", url, fake[0], content_type=BINARY) == {"accepted": 1}  # the attacker, first
    assert http("POST", url + "/batch", encode_batch([fake[1]]), content_type=BINARY)["accepted"] == 1
    with pytest.raises(ServerError, match=f"409 {TAKEN}") as taken:
        http("POST", url, honest[0], content_type=BINARY)
    assert taken.value.status == 409
    with pytest.raises(ServerError, match="409 duplicate report id"):  # its own bytes again: a duplicate
        http("POST", url, fake[0], content_type=BINARY)
    broken = bytearray(honest[3])
    broken[-3] ^= 1  # inside the last sealed share (server 1's): server 0 still opens its own
    batch = [honest[2], honest[1], fake[1], bytes(broken) if party == 1 else honest[3], honest[0]]
    res = http("POST", url + "/batch", encode_batch(batch), content_type=BINARY)
    refused = {r["index"]: r["error"] for r in res["rejected"]}
    if party == 1:
        assert (res["accepted"], res["duplicates"], res["conflicts"]) == (1, 1, 2)
        assert refused[1] == refused[4] == TAKEN and "does not open" in refused[3] and len(refused) == 3
    else:
        assert (res["accepted"], res["duplicates"], res["conflicts"]) == (2, 1, 2)
        assert refused == {1: TAKEN, 4: TAKEN}
    stored = http("GET", f"{pair[party]}/tasks/{config.task_id}", token=token)["reports"]
    assert stored == res["accepted"] + 2  # the attacker's two and the new ones: nothing stored twice
    assert 'reason="id_taken"' in fetch("GET", f"{pair[party]}/metrics", token=OPERATOR).decode()


@pytest.mark.parametrize("verified", [True, False])
def test_a_front_run_report_is_a_conflict_and_the_same_bytes_stay_acknowledged(tmp_path, verified):
    """`dpcdf submit` while server 1 is down: server 0 (here the deviating one) holds all 20 reports and
    their ids. Before server 1 gets them, the attacker stores 5 reports of its own under 5 of those ids
    there; 5 others reach server 1 with the honest bytes (uploads whose answers were lost). The re-run
    of the same command must exit non-zero naming the 5 conflicts, take the 5 same-byte ones as
    acknowledged, and never count the 5 as complete; the close then counts the 15: server 1 left the
    conflicted ids out of its set, so the reconciliation drops them at server 0 too (the review found an
    unverified task pairing the attacker's share with the honest one: garbage counts), and the release
    is the 15 honest values exactly. Before issue 42 the re-run exited 0 with all 20 "complete"."""
    ports = [free_port(), free_port()]
    servers = [start_server(p, str(tmp_path / f"s{p}"), port=ports[p], noise=False, extra_env=TESTING) for p in (0, 1)]
    try:
        task = tmp_path / "task.json"
        made = dpcdf_cli("task", "--servers", *[u for _, u in servers], "--grid", "uniform:0:100:6",
                         "--epsilon", "1", "--mechanism", "tree", "--min-batch", "1", "--out", str(task),
                         *([] if verified else ["--unverified"]))
        assert made.returncode == 0, made.stderr
        config = TaskConfig.from_json(task.read_text())
        token = (tmp_path / "task.json.token").read_text()
        assert config.verify == verified
        data = tmp_path / "values.csv"
        with open(data, "w", newline="") as f:
            csv.writer(f).writerows([["value"]] + [[repr(float(v))] for v in values(20, 3)])
        command = ["submit", "--task", str(task), "--csv", str(data), "--retry-for", "0.5", "--spool", str(tmp_path / "spool")]
        stop(servers[1][0])
        first = dpcdf_cli(*command)
        assert first.returncode != 0 and "run the same command again" in first.stderr, first.stderr
        db = sqlite3.connect(tmp_path / "s0" / "server.sqlite")  # what a deviating server 0 knows
        ids = [bytes(r[0]) for r in db.execute("SELECT report_id FROM reports ORDER BY seq")]
        db.close()
        spool = sqlite3.connect(tmp_path / "spool")
        bodies = dict((bytes(r[0]), bytes(r[1])) for r in spool.execute("SELECT report_id, body FROM reports"))
        spool.close()
        assert len(ids) == 20 and set(ids) == set(bodies)

        servers[1] = start_server(1, str(tmp_path / "s1"), port=ports[1], noise=False, extra_env=TESTING)
        url = f"{servers[1][1]}/tasks/{config.task_id}/reports/batch"
        fake = impostors(config, ids[:5], [50.0] * 5)
        assert http("POST", url, encode_batch(fake), content_type=BINARY)["accepted"] == 5
        lost = http("POST", url, encode_batch([bodies[i] for i in ids[5:10]]), content_type=BINARY)
        assert lost["accepted"] == 5  # stored, but the client never heard: the re-run sends them again

        again = dpcdf_cli(*command)
        assert again.returncode != 0, again.stderr
        assert "5 reports conflicted" in again.stderr and TAKEN in again.stderr, again.stderr
        summary = json.loads(again.stdout.strip().splitlines()[-1])
        assert (summary["conflicts"], summary["complete"], summary["pending"], summary["rejected"]) == (5, 15, 0, 5)
        spool = sqlite3.connect(tmp_path / "spool")
        acked = {bytes(r[0]) for r in spool.execute(
            "SELECT report_id FROM reports JOIN acks USING (row) WHERE party = 1 AND rejected IS NULL")}
        spool.close()
        assert acked == set(ids[5:]) and acked.isdisjoint(ids[:5])  # the same bytes acknowledged, the taken ones not

        third = dpcdf_cli(*command)  # a conflict stays a failure on every re-run, and is not sent again
        assert third.returncode != 0 and "5 reports conflicted" in third.stderr, third.stderr

        analyst = Analyst(config, token)
        assert analyst.close() == 15
        assert analyst.rejected == ({} if verified else None)  # dropped by the reconciliation, not by the check
        honest = values(20, 3)[[k for k, i in enumerate(sorted(ids, key=ids.index)) if i not in ids[:5]]]
        counts, _ = analyst.prefix_counts(range(config.make_grid().size))
        assert np.array_equal(np.asarray(counts), prefix_counts(honest, config.make_grid()))  # noise off: exact
    finally:
        for proc, _ in servers:
            if proc.poll() is None:
                stop(proc)
