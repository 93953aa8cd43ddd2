"""The close: both servers agree on one report set, through the analyst, without it learning anything
about the set (real server processes)."""
import hashlib
import json

import numpy as np
import pytest

from dpcdf.analyst import Analyst
from dpcdf.service.http import ServerError, http
from dpcdf.service.client import create_task, submit
from dpcdf.service.client import make_reports
from dpcdf.release.ecdf import prefix_counts
from helpers import GRID, urls, values


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


def test_no_answer_and_no_hash_before_the_reconciliation_ends(servers):
    """Queries wait until the server's last reconciliation message (an answer before it, then a drop,
    would let two answers differ by the dropped reports), and intermediate close replies carry no
    report-set hash or count (a hash that changed between rounds would show that something was
    dropped)."""
    procs, _ = servers
    config, token = create_task(urls(procs["exact"]), GRID, 1.0, "path", "substitution", min_batch=1)
    submit(config, values(20, 15))
    _post(_reports_path(config, 0), make_reports(config, [7.0])[0])
    close = [f"{u}/tasks/{config.task_id}/close" for u in config.servers]
    query = b'{"kind": "prefix", "indices": [3]}'
    sync, replies = None, []
    for party in (0, 1, 0, 1):
        replies.append(http("POST", close[party], json.dumps({"sync": sync}).encode(), token))
        sync = replies[-1]["sync"]
        if len(replies) == 2:  # neither server is done yet
            for url in config.servers:
                with pytest.raises(ServerError, match="409 the task is not closed"):
                    http("POST", f"{url}/tasks/{config.task_id}/query", query, token)
    assert [r["reports_hash"] is None for r in replies] == [True, True, False, False]
    assert replies[2]["reports_hash"] == replies[3]["reports_hash"] and replies[3]["n"] == 20
    answers = [http("POST", f"{u}/tasks/{config.task_id}/query", query, token) for u in config.servers]
    assert answers[0]["reports_hash"] == answers[1]["reports_hash"] == replies[3]["reports_hash"]


def test_more_differences_than_listed_stop_the_task_and_drop_no_honest_report(servers):
    """70 one-sided reports: more differing buckets than message 2 lists. Dropping whole buckets would
    drop honest reports, depending on them (a review showed that under add/remove this told an empty
    set from a non-empty one): the close refuses instead, and no query is answered."""
    procs, _ = servers
    config, token = create_task(urls(procs["exact"]), GRID, 1.0, "path", "substitution", min_batch=1)
    submit(config, values(30, 18))
    for r in make_reports(config, values(70, 19)):
        _post(_reports_path(config, 0), r)
    analyst = Analyst(config, token)
    with pytest.raises(ServerError, match="409 the servers' report sets differ in more than 64 places"):
        analyst.close()
    with pytest.raises(ServerError, match="409 the task is not closed"):
        http("POST", f"{config.servers[0]}/tasks/{config.task_id}/query", b'{"kind": "prefix", "indices": [3]}', token)


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


def test_sync_messages_cannot_be_forged_reflected_or_replayed_elsewhere(servers):
    procs, _ = servers
    made = [create_task(urls(procs["exact"]), GRID, 1.0, "path", "substitution", min_batch=1) for _ in range(2)]
    for config, _ in made:
        submit(config, values(10, 16))
    (config, token), (other, other_token) = made
    close = [f"{u}/tasks/{config.task_id}/close" for u in config.servers]
    first = http("POST", close[0], b"{}", token)["sync"]
    second = http("POST", close[1], json.dumps({"sync": first}).encode(), token)["sync"]
    forged = "01" + "00" * 40
    for target, message, why in [(close[1], forged, "not the other server's"), (close[1], second, "round 1 or 3 here, not 2"),
                                 (close[0], first, "round 2 here, not 1"), (close[1], "zz", "hex string"),
                                 (close[1], None, "server 1 closes with server 0's sync message")]:
        with pytest.raises(ServerError, match=f"400 .*{why}"):
            http("POST", target, json.dumps({"sync": message}).encode(), token)
    elsewhere = f"{other.servers[1]}/tasks/{other.task_id}/close"
    with pytest.raises(ServerError, match="400 the sync message is not the other server's"):
        http("POST", elsewhere, json.dumps({"sync": first}).encode(), other_token)


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
        _post(_reports_path(config, 0), make_reports(config, [50.0])[0])  # and one on server 0 only
        close = [f"{u}/tasks/{config.task_id}/close" for u in config.servers]
        sync, answers = None, []
        for party in (0, 1, 0, 1):
            answers.append(http("POST", close[party], json.dumps({"sync": sync}).encode(), token))
            sync = answers[-1]["sync"]
        lengths |= {(k, len(a["sync"] or "")) for k, a in enumerate(answers)}
        assert all(a["n"] is None for a in answers)
        plain = hashlib.sha256(b"".join(sorted(r.report_id for r in reports))).hexdigest()
        assert answers[2]["reports_hash"] == answers[3]["reports_hash"] != plain
    assert len(lengths) == 4  # one length per message, for 5 reports and for 40


def test_message_tables_round_trip_at_their_fixed_lengths():
    import secrets

    from dpcdf import reconcile

    key = secrets.token_bytes(32)
    ids = [secrets.token_bytes(16) for _ in range(500)]
    which = reconcile.buckets(key, ids)
    many = np.unique(which)[:70]  # more than LISTED
    grouped = reconcile.members(ids, which, many)
    with pytest.raises(reconcile.TooManyDifferences):
        reconcile.id_table(many, grouped)
    differ = many[:reconcile.LISTED]
    table = reconcile.id_table(differ, grouped)
    assert len(reconcile.bitmap(differ) + table) == reconcile.ROUND_LENGTHS[2]
    back = reconcile.read_id_table(table, differ)
    assert len(back) == reconcile.LISTED and all(back[int(b)] == set(grouped[int(b)]) for b in differ)
    with pytest.raises(reconcile.SyncError, match="lists too few buckets"):
        reconcile.read_id_table(table, many)
    grouped[int(differ[0])] = [secrets.token_bytes(16) for _ in range(reconcile.SLOT + 1)]  # overfull
    with pytest.raises(reconcile.TooManyDifferences):
        reconcile.id_table(differ, grouped)
    np.testing.assert_array_equal(reconcile.from_bitmap(reconcile.bitmap(differ)), differ)
    listed = reconcile.id_list(ids[:10])
    assert len(listed) == reconcile.ROUND_LENGTHS[3] and reconcile.read_id_list(listed) == ids[:10]
    assert len(reconcile.bucket_digests(key, ids)) == reconcile.ROUND_LENGTHS[1]
    assert reconcile.set_hash(key, ids) == reconcile.set_hash(key, ids[::-1]) != reconcile.set_hash(key, ids[1:])


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
            http("POST", f"{pair[0]}/tasks", config.to_json().encode())
