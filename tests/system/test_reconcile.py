"""The close: both servers agree on one report set, through the analyst, without it learning anything
about the set (real server processes)."""
import hashlib
import json

import numpy as np
import pytest

from dpcdf.analyst import Analyst, ServerError, http
from dpcdf.cli import create_task, submit
from dpcdf.client import make_reports
from dpcdf.release import prefix_counts
from helpers import GRID, urls, values


def _post(url: str, report) -> None:
    http("POST", url, report.to_bytes(), content_type="application/octet-stream")


def _reports_path(config, party: int) -> str:
    return f"{config.servers[party]}/tasks/{config.task_id}/reports"


def test_a_report_that_reached_one_server_only_is_dropped_from_both(servers):
    procs, _ = servers
    config, token = create_task(urls(procs["exact"]), GRID, 1.0, "path", "substitution", min_batch=1)
    vals = values(30, 14)
    submit(config, vals)
    lone = make_reports(config, [7.0])[0]
    _post(_reports_path(config, 0), lone)  # the client crashed before its second upload
    analyst = Analyst(config, token)
    n = analyst.close()
    counts, n_answer = analyst.prefix_counts(range(64))
    truth = prefix_counts(vals, config.make_grid())
    # the lone report is gone (with any honest one that shared its bucket: 30 / 65536 odds); the
    # shares cancel, so the counts are exact counts of the kept reports
    assert n == n_answer == counts[-1] and n in (29, 30)
    assert np.all(counts <= truth) and np.all(truth - counts <= 30 - n)
    with pytest.raises(ServerError, match="409 collection is closed"):
        _post(_reports_path(config, 1), lone)
    assert analyst.close() == n  # closing again changes nothing


def test_reconciling_after_an_answer_is_refused(servers):
    """Once a server has answered, dropping reports would let two answers differ by their exact
    contribution: the close refuses, and the analyst says why."""
    procs, _ = servers
    config, token = create_task(urls(procs["exact"]), GRID, 1.0, "path", "substitution", min_batch=1)
    submit(config, values(20, 15))
    _post(_reports_path(config, 0), make_reports(config, [7.0])[0])
    for url in config.servers:  # queries straight to the servers, skipping the close
        http("POST", f"{url}/tasks/{config.task_id}/query", b'{"kind": "prefix", "indices": [3]}', token)
    with pytest.raises(ServerError, match="409 the servers' report sets differ and this server has already answered"):
        Analyst(config, token).prefix_counts([3])


def test_sync_messages_cannot_be_forged_reflected_or_replayed_elsewhere(servers):
    procs, _ = servers
    made = [create_task(urls(procs["exact"]), GRID, 1.0, "path", "substitution", min_batch=1) for _ in range(2)]
    for config, _ in made:
        submit(config, values(10, 16))
    (config, token), (other, other_token) = made
    close = [f"{u}/tasks/{config.task_id}/close" for u in config.servers]
    from_0 = http("POST", close[0], b"{}", token)["sync"]
    from_1 = http("POST", close[1], json.dumps({"sync": from_0}).encode(), token)["sync"]
    for target, message, why in [(close[1], "00" * 40, "not server 0's"), (close[1], from_1, "not server 0's"),
                                 (close[0], from_0, "not server 1's"), (close[1], "zz", "hex string"),
                                 (close[1], None, "server 1 closes with server 0's sync message")]:
        with pytest.raises(ServerError, match=f"400 .*{why}"):
            http("POST", target, json.dumps({"sync": message}).encode(), token)
    elsewhere = f"{other.servers[1]}/tasks/{other.task_id}/close"
    with pytest.raises(ServerError, match="400 the sync message is not server 0's"):
        http("POST", elsewhere, json.dumps({"sync": from_0}).encode(), other_token)


def test_under_add_remove_the_analyst_learns_nothing_about_the_report_set(servers):
    """The report-set hash is keyed with a key only the servers share (a plain hash of the ids let
    an analyst who knows everyone else's report ids tell whether one more person reported), and the
    close's messages have one length whatever the number of reports."""
    procs, _ = servers
    lengths = set()
    for n in (5, 40):
        config, token = create_task(urls(procs["exact"]), GRID, 1.0, "tree", "add-remove", min_batch=0)
        reports = make_reports(config, values(n, 17))
        for r in reports:
            for party in (0, 1):
                _post(_reports_path(config, party), r)
        close = [f"{u}/tasks/{config.task_id}/close" for u in config.servers]
        first = http("POST", close[0], b"{}", token)
        second = http("POST", close[1], json.dumps({"sync": first["sync"]}).encode(), token)
        lengths |= {("0", len(first["sync"])), ("1", len(second["sync"]))}
        assert first["n"] is None and second["n"] is None
        plain = hashlib.sha256(b"".join(sorted(r.report_id for r in reports))).hexdigest()
        assert first["reports_hash"] == second["reports_hash"] != plain
    assert len(lengths) == 2  # one length per direction, for 5 and for 40 reports
