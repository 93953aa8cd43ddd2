"""The close: server 0 reconciles the report sets with server 1 directly, whatever the number of
one-sided reports; the analyst learns nothing about the set beyond n (real server processes)."""
import hashlib

import numpy as np
import pytest

from dpcdf.analyst import Analyst
from dpcdf.service.http import ServerError, fetch, http
from dpcdf.service.client import create_task, submit
from dpcdf.service.client import make_reports
from dpcdf.service.processes import free_port, start_server, stop
from dpcdf.service.protocols.channel import PEER_HEADER
from dpcdf.service.storage.segments import task_dir
from dpcdf.service.wire import encode_batch
from dpcdf.release.ecdf import prefix_counts
from helpers import GRID, OPERATOR, TESTING, urls, values


def _post(url: str, report) -> None:
    http("POST", url, report.to_bytes(), content_type="application/octet-stream")


def _reports_path(config, party: int) -> str:
    return f"{config.servers[party]}/tasks/{config.task_id}/reports"


def test_reports_that_reached_one_server_only_are_dropped_and_no_other(servers):
    """A report on server 0 only and one on server 1 only (clients that crashed between their two
    uploads): after the close both are gone, every other report counts, the shares cancel."""
    procs, _ = servers
    config, token = create_task(urls(procs["exact"]), GRID, 1.0, "path", "substitution", min_batch=1)
    vals = values(30, 14)
    submit(config, vals)
    lone = make_reports(config, [7.0, 93.0])
    _post(_reports_path(config, 0), lone[0])
    _post(_reports_path(config, 1), lone[1])
    analyst = Analyst(config, token)
    assert analyst.close() == 30
    counts, n = analyst.prefix_counts(range(64))
    np.testing.assert_array_equal(counts, prefix_counts(vals, config.make_grid()))
    assert n == 30
    with pytest.raises(ServerError, match="409 collection is closed"):
        _post(_reports_path(config, 1), lone[0])
    assert analyst.close() == 30  # closing again changes nothing


def test_no_answer_and_no_hash_before_server_0_has_reconciled(servers):
    """Server 1 shows no hash and answers no query until server 0's close has reconciled it (an answer
    before a drop would let two answers differ by the dropped reports)."""
    procs, _ = servers
    config, token = create_task(urls(procs["exact"]), GRID, 1.0, "path", "substitution", min_batch=1)
    submit(config, values(20, 15))
    _post(_reports_path(config, 0), make_reports(config, [7.0])[0])
    close = [f"{u}/tasks/{config.task_id}/close" for u in config.servers]
    query = b'{"kind": "prefix", "indices": [3]}'
    with pytest.raises(ServerError, match="409 server 1 is reconciled by server 0's close"):
        http("POST", close[1], b"", token)
    for url in config.servers:
        with pytest.raises(ServerError, match="409 the task is not closed"):
            http("POST", f"{url}/tasks/{config.task_id}/query", query, token)
    views = [http("POST", close[party], b"", token) for party in (0, 1)]
    assert views[0]["reports_hash"] == views[1]["reports_hash"] and views[0]["n"] == views[1]["n"] == 20
    answers = [http("POST", f"{u}/tasks/{config.task_id}/query", query, token) for u in config.servers]
    assert answers[0]["reports_hash"] == answers[1]["reports_hash"] == views[1]["reports_hash"]


def test_ten_thousand_one_sided_reports_close_with_exactly_the_two_sided_ones(servers):
    """10,000 reports on server 0 only and 500 on server 1 only (a flood, or clients that never
    resumed): the close succeeds with exactly the 300 reports both hold, counted exactly."""
    procs, _ = servers
    config, token = create_task(urls(procs["exact"]), GRID, 1.0, "tree", "substitution", min_batch=1)
    vals = values(300, 18)
    submit(config, vals)
    for party, count in ((0, 10_000), (1, 500)):
        lone = [r.to_bytes() for r in make_reports(config, values(count, 19 + party))]
        res = http("POST", f"{_reports_path(config, party)}/batch", encode_batch(lone), content_type="application/octet-stream")
        assert res["accepted"] == count
    analyst = Analyst(config, token)
    assert analyst.close() == 300
    for _, _, data in procs["exact"]:  # a verified close keeps a histogram share, not the key shares' segments
        assert not list(task_dir(data, config.task_id).glob("*.npy")), data
    counts, n = analyst.prefix_counts(range(64))
    np.testing.assert_array_equal(counts, prefix_counts(vals, config.make_grid()))


def test_the_minimum_batch_counts_after_reconciliation(servers):
    procs, _ = servers
    config, token = create_task(urls(procs["exact"]), GRID, 1.0, "path", "substitution", min_batch=30)
    submit(config, values(29, 20))
    lone = make_reports(config, [7.0, 93.0])
    _post(_reports_path(config, 0), lone[0])
    _post(_reports_path(config, 1), lone[1])
    analyst = Analyst(config, token)
    assert analyst.close() == 29
    with pytest.raises(ServerError, match="403 the task has 29 reports after reconciliation; queries need at least 30"):
        analyst.prefix_counts([3])


def test_sync_messages_without_the_other_servers_request_tag_are_refused(servers):
    """The servers' channel needs no token, but the other server's request tag (issue 42): without one a
    message is a 401, with a wrong one a 403, the same for server 0, for an unknown task id and for
    server 1's real task (no probing); and changes nothing: the close still succeeds after. (A message
    with a valid tag that does not open under the servers' key is a 400: tests/service/system/
    test_deviating_server.py, whose server 0 holds the key.)"""
    procs, _ = servers
    config, token = create_task(urls(procs["exact"]), GRID, 1.0, "path", "substitution", min_batch=1)
    submit(config, values(10, 16))
    sync = [f"{u}/tasks/{config.task_id}/sync" for u in config.servers]
    message = b"\x01" + bytes(60)
    wrong = {PEER_HEADER: f"v1 {message[:17].hex()} {'00' * 32}"}
    for target, headers, status in [(sync[1], {}, "401 a server-to-server message needs the other server's request tag"),
                                    (sync[1], wrong, "403 the request tag is not the other server's"),
                                    (sync[0], wrong, "403 the request tag is not the other server's"),
                                    (f"{config.servers[1]}/tasks/nosuchtask/sync", wrong, "403 the request tag is not"),
                                    (f"{config.servers[1]}/tasks/nosuchtask/sync", {}, "401 ")]:
        with pytest.raises(ServerError, match=status):
            fetch("POST", target, message, content_type="application/octet-stream", headers=headers)
    assert Analyst(config, token).close() == 10


def test_under_add_remove_the_analyst_learns_nothing_about_the_report_set(servers):
    """The report-set hash is keyed with a key only the servers share (a plain hash of the ids let
    an analyst who knows everyone else's report ids tell whether one more person reported), n is not
    shown, and the reconciliation's messages never pass through the analyst."""
    procs, _ = servers
    config, token = create_task(urls(procs["exact"]), GRID, 1.0, "tree", "add-remove", min_batch=0)
    reports = make_reports(config, values(40, 17))
    for r in reports:
        for party in (0, 1):
            _post(_reports_path(config, party), r)
    _post(_reports_path(config, 0), make_reports(config, [50.0])[0])  # and one on server 0 only
    views = [http("POST", f"{u}/tasks/{config.task_id}/close", b"", token) for u in config.servers]
    assert all(v["n"] is None for v in views) and set(views[0]) == {"party", "closed", "reconciled", "n", "reports_hash", "rejected"}
    plain = hashlib.sha256(b"".join(sorted(r.report_id for r in reports))).hexdigest()
    assert views[0]["reports_hash"] == views[1]["reports_hash"] != plain


def test_a_close_interrupted_by_server_1_is_finished_by_closing_again(tmp_path):
    """Server 1 down during the close: server 0 answers 502 and answers no query; once server 1 is
    back (same data), the same close completes with every report."""
    ports = [free_port(), free_port()]
    procs = [start_server(p, str(tmp_path / f"s{p}"), port=ports[p], noise=False, extra_env=TESTING) for p in (0, 1)]
    try:
        config, token = create_task([u for _, u in procs], GRID, 1.0, "path", "substitution", min_batch=1)
        vals = values(40, 21)
        submit(config, vals)
        _post(_reports_path(config, 1), make_reports(config, [3.0])[0])
        stop(procs[1][0])
        analyst = Analyst(config, token)
        with pytest.raises(ServerError, match="502 server 1 did not take part in the close"):
            analyst.close()
        with pytest.raises(ServerError, match="409 the task is not closed"):
            http("POST", f"{config.servers[0]}/tasks/{config.task_id}/query", b'{"kind": "prefix", "indices": [3]}', token)
        procs[1] = start_server(1, str(tmp_path / "s1"), port=ports[1], noise=False, extra_env=TESTING)
        assert analyst.close() == 40
        counts, _ = analyst.prefix_counts(range(64))
        np.testing.assert_array_equal(counts, prefix_counts(vals, config.make_grid()))
    finally:
        for proc, _ in procs:
            if proc.poll() is None:
                stop(proc)


def test_a_task_naming_a_bad_key_for_the_other_server_is_refused(servers):
    """The servers' shared key comes from the other server's X25519 key in the config: a key that
    is no key (all zeros, too short) is refused at registration, not a 500 on every later request."""
    from dpcdf.service.task import TaskConfig, token_hash

    procs, _ = servers
    pair = urls(procs["exact"])
    own = http("GET", f"{pair[0]}/hpke")["keys"]["x25519"]
    for peer in ("00" * 32, "abcd"):
        config = TaskConfig(GRID, 1.0, "path", "substitution", 1, (pair[0], pair[1]), (own, peer), token_hash("t"))
        with pytest.raises(ServerError, match="400 server 1's HPKE key in the task is not a x25519 key"):
            http("POST", f"{pair[0]}/tasks", config.to_json().encode(), OPERATOR)
