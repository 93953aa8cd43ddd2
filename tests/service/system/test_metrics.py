"""GET /metrics and `dpcdf admin` on real servers (issue 24): the counters move with reports, refusals,
a close and a query; the admin commands list, close and delete a task; a wrong token gets 401/403 on
/metrics and every admin route, the same for a task that exists and one that does not."""
import re
import subprocess
import sys

import pytest

from dpcdf.analyst import Analyst
from dpcdf.service.client import create_task, submit
from dpcdf.service.http import ServerError, fetch, http
from helpers import GRID, OPERATOR, urls, values


def _value(text: str, sample: str) -> float:
    m = re.search("^" + re.escape(sample) + r" (\S+)$", text, re.M)
    return float(m.group(1)) if m else 0.0


def _scrape(url: str) -> str:
    return fetch("GET", f"{url}/metrics", token=OPERATOR).decode()


def _dpcdf(*args):
    return subprocess.run([sys.executable, "-m", "dpcdf", *args], capture_output=True, text=True, timeout=120)


BATCH = 'dpcdf_http_request_duration_seconds_count{method="POST",route="/tasks/{task_id}/reports/batch"}'


def test_counters_move_after_reports_a_refusal_a_close_and_a_query(servers):
    procs, _ = servers
    pair = urls(procs["exact"])
    config, token = create_task(pair, GRID, 1.0, "tree", "substitution", min_batch=1)
    before = [_scrape(u) for u in pair]
    submit(config, values(60, 21), batch=20)
    with pytest.raises(ServerError, match="400"):
        http("POST", f"{pair[1]}/tasks/{config.task_id}/reports", b"not a report", content_type="application/octet-stream")
    analyst = Analyst(config, token)
    analyst.close()
    analyst.prefix_counts([3, 30])
    after = [_scrape(u) for u in pair]
    for p in (0, 1):
        assert _value(after[p], "dpcdf_reports_accepted_total") - _value(before[p], "dpcdf_reports_accepted_total") == 60
        assert _value(after[p], BATCH) - _value(before[p], BATCH) == 3
        query = 'dpcdf_queries_total{status="200"}'
        assert _value(after[p], query) - _value(before[p], query) == 1
    refused = 'dpcdf_reports_refused_total{reason="malformed"}'
    assert _value(after[1], refused) - _value(before[1], refused) == 1
    close = 'dpcdf_closes_total{status="200"}'
    assert _value(after[0], close) - _value(before[0], close) == 1
    assert "# TYPE dpcdf_http_request_duration_seconds histogram" in after[0]
    printed = _dpcdf("admin", "metrics", "--server", pair[0])
    assert printed.returncode == 0 and "dpcdf_reports_accepted_total" in printed.stdout


def test_the_admin_commands_list_close_and_delete_a_task(servers):
    procs, _ = servers
    pair = urls(procs["exact"])
    config, token = create_task(pair, GRID, 1.0, "tree", "substitution", min_batch=1)
    submit(config, values(30, 22))
    closed = _dpcdf("admin", "close", "--server", pair[0], config.task_id)
    assert closed.returncode == 0 and '"n": 30' in closed.stdout
    refused = _dpcdf("admin", "close", "--server", pair[1], config.task_id)
    assert refused.returncode == 2 and "close the task on server 0" in refused.stderr and refused.stderr.count("\n") == 1
    listing = _dpcdf("admin", "tasks", "--server", pair[0])
    line = next(row for row in listing.stdout.splitlines() if row.startswith(config.task_id))
    assert line.split()[1] in ("verified", "released") and line.split()[3:5] in (["30", "30"], ["0", "30"])
    for url in pair:
        deleted = _dpcdf("admin", "delete", "--server", url, config.task_id)
        assert deleted.returncode == 0 and f"task {config.task_id} deleted" in deleted.stdout
    with pytest.raises(ServerError, match="410"):
        Analyst(config, token).prefix_counts([1])
    missing = _dpcdf("admin", "delete", "--server", pair[0], "0" * 32)
    assert missing.returncode == 2 and "404" in missing.stderr and missing.stderr.count("\n") == 1


def test_a_close_after_a_delete_on_server_1_says_a_retry_cannot_work(servers):
    """Issue 46: the operator of server 1 deleted the task; the analyst's close fails (502) and says that
    closing again cannot succeed (server 1 cannot open the message for a task it no longer has), not
    "close again to retry"."""
    procs, _ = servers
    pair = urls(procs["exact"])
    config, token = create_task(pair, GRID, 1.0, "tree", "substitution", min_batch=1)
    submit(config, values(20, 23))
    assert _dpcdf("admin", "delete", "--server", pair[1], config.task_id).returncode == 0
    with pytest.raises(ServerError, match="closing again cannot succeed") as failed:
        Analyst(config, token).close()
    assert "close again to retry" not in str(failed.value) and "502" in str(failed.value)


def test_wrong_tokens_on_metrics_and_admin_routes_tell_nothing(servers):
    procs, _ = servers
    pair = urls(procs["exact"])
    config, _ = create_task(pair, GRID, 1.0, "tree", "substitution", min_batch=1)
    for token, status in ((None, 401), ("not-the-operator-token", 403)):
        for task_id in (config.task_id, "f" * 32):
            for method, path in (("GET", "/metrics"), ("GET", "/admin/tasks"), ("POST", "/admin/retention"),
                                 ("POST", f"/admin/tasks/{task_id}/close"), ("DELETE", f"/admin/tasks/{task_id}")):
                with pytest.raises(ServerError) as err:
                    fetch(method, pair[0] + path, token=token)
                assert err.value.status == status, (method, path)
    wrong = _dpcdf("admin", "tasks", "--server", pair[0], "--token-file", "/dev/null")
    assert wrong.returncode == 2 and "operator token" in wrong.stderr
    assert http("GET", f"{pair[0]}/admin/tasks", token=OPERATOR)["tasks"]  # the right token still works
