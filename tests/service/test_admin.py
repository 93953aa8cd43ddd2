"""The admin API and /metrics in process (issue 24): the operator's token is checked before anything
else (the same 401/403 for a task that exists and one that does not), the metrics are well-formed
Prometheus text whose counters move, and a deleted task answers its analyst 410 (others 401, as for an
unknown task) and refuses uploads."""
import re
import warnings

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import x25519

from dpcdf.service.client import make_reports
from dpcdf.service.server import create_app
from dpcdf.service.server.metrics import Metrics, reason
from dpcdf.service.task import TaskConfig, token_hash
from dpcdf.service.wire import FOREIGN, encode_batch
from helpers import GRID, OPERATOR, values

with warnings.catch_warnings():
    warnings.filterwarnings("ignore", message=".*httpx2")
    from fastapi.testclient import TestClient

TOKEN = "the analyst's token for admin tests"
JSON = {"content-type": "application/json"}
AUTH = {"authorization": f"Bearer {OPERATOR}"}
ANALYST = {"authorization": f"Bearer {TOKEN}"}
SAMPLE = re.compile(r'^[a-z_]+(\{([a-z_]+="([^"\\]|\\.)*",?)*\})? (-?[0-9.e+]+|\+Inf)$')


@pytest.fixture
def app(tmp_path):
    client = TestClient(create_app(0, tmp_path / "data", warm_up=False))
    own = client.get("/hpke").json()["keys"]["x25519"]
    peer = x25519.X25519PrivateKey.generate().public_key().public_bytes(serialization.Encoding.Raw,
                                                                         serialization.PublicFormat.Raw).hex()
    config = TaskConfig(GRID, 1.0, "tree", "substitution", 0, ("http://a", "http://b"), (own, peer), token_hash(TOKEN))
    assert client.post("/tasks", content=config.to_json(), headers=JSON | AUTH).status_code == 201
    return client, config.task_id


def _routes(task_id):
    return [("GET", "/metrics"), ("GET", "/admin/tasks"), ("POST", "/admin/retention"),
            ("POST", f"/admin/tasks/{task_id}/close"), ("DELETE", f"/admin/tasks/{task_id}")]


def test_wrong_tokens_get_401_or_403_and_the_same_answer_for_unknown_tasks(app):
    client, task_id = app
    for headers, status in (({}, 401), ({"authorization": "Basic eA=="}, 401), ({"authorization": "Bearer wrong-token"}, 403),
                            (ANALYST, 403)):
        seen = set()
        for known, unknown in zip(_routes(task_id), _routes("0" * 32)):
            a, b = (client.request(m, p, headers=headers) for m, p in (known, unknown))
            assert a.status_code == b.status_code == status, (known, headers)
            assert a.json()["error"].split(" needs")[-1] == b.json()["error"].split(" needs")[-1]
            seen.add(a.status_code)
        assert seen == {status}
    assert client.get("/admin/tasks", headers=AUTH).json()["tasks"][0]["stored"] == 0  # nothing was deleted or closed


def test_metrics_are_prometheus_text_and_count_requests(app):
    client, task_id = app
    client.post(f"/tasks/{task_id}/reports", content=b"junk")  # a refused report
    client.post(f"/tasks/{task_id}/reports/batch", content=b"junk")  # a refused batch
    client.get(f"/tasks/{task_id}", headers=ANALYST)
    answer = client.get("/metrics", headers=AUTH)
    assert answer.status_code == 200 and answer.headers["content-type"].startswith("text/plain; version=0.0.4")
    text = answer.text
    for line in text.splitlines():
        assert line.startswith("# HELP ") or line.startswith("# TYPE ") or SAMPLE.match(line), line
    assert 'dpcdf_http_requests_total{method="GET",route="/tasks/{task_id}",status="200"} 1' in text
    assert 'dpcdf_reports_refused_total{reason="malformed"} 1' in text
    assert 'dpcdf_uploads_refused_total{reason="malformed"} 2' in text
    assert 'dpcdf_tasks{state="collecting"} 1' in text and "dpcdf_check_backlog 0" in text
    assert task_id not in text and TOKEN not in text
    buckets = re.findall(r'dpcdf_http_request_duration_seconds_bucket\{method="GET",route="/tasks/\{task_id\}",le="([^"]+)"\} (\d+)', text)
    assert buckets[-1] == ("+Inf", "1") and [int(n) for _, n in buckets] == sorted(int(n) for _, n in buckets)
    again = client.get("/metrics", headers=AUTH).text
    assert 'dpcdf_http_requests_total{method="GET",route="/metrics",status="200"} 1' in again


def test_a_deleted_task_answers_its_analyst_410_and_others_as_unknown(app):
    client, task_id = app
    listing = client.get("/admin/tasks", headers=AUTH).json()
    assert listing["party"] == 0 and [t["state"] for t in listing["tasks"]] == ["collecting"]
    out = client.delete(f"/admin/tasks/{task_id}", headers=AUTH)
    assert out.status_code == 200 and out.json() == {"task_id": task_id, "reason": "deleted", "reports": 0, "files": 0}
    assert client.delete("/admin/tasks/" + "0" * 32, headers=AUTH).status_code == 404
    gone = client.get(f"/tasks/{task_id}", headers=ANALYST)
    assert gone.status_code == 410 and "deleted" in gone.json()["error"]
    assert client.post(f"/tasks/{task_id}/close", headers=ANALYST).status_code == 410
    wrong = client.get(f"/tasks/{task_id}", headers={"authorization": "Bearer made-up"})
    unknown = client.get("/tasks/" + "0" * 32, headers=ANALYST)
    assert (wrong.status_code, wrong.text) == (unknown.status_code, unknown.text) == (401, wrong.text)
    assert client.post(f"/admin/tasks/{task_id}/close", headers=AUTH).status_code == 410
    config = client.app.state.server.store.task(task_id)[0]
    late = client.post(f"/tasks/{task_id}/reports/batch", content=encode_batch(
        [r.to_bytes() for r in make_reports(TaskConfig.from_json(config), values(3, 1))]))
    assert late.status_code == 409 and "deleted by this server's operator" in late.json()["error"], late.text  # not "the analyst closed it"
    again = client.post("/tasks", content=config, headers=JSON | AUTH)  # its id stays taken, on no fresh seed
    assert again.status_code == 409 and "register a new task" in again.json()["error"]
    assert client.get("/admin/tasks", headers=AUTH).json()["tasks"][0]["state"] == "deleted"
    text = client.get("/metrics", headers=AUTH).text
    assert 'dpcdf_retention_purged_total{reason="deleted"} 1' in text and 'dpcdf_tasks{state="deleted"} 1' in text


def test_refusal_reasons_and_escaping():
    assert reason(FOREIGN) == "foreign_task"
    assert reason("the share does not open with this server's key") == "does_not_open"
    assert reason("this server's sealed share must be a 32-byte encapsulated key") == "wrong_length"
    m = Metrics()
    m.observe("GET", 'a"b\\c\nd', 200, 0.001)
    m.observe("GET", 'a"b\\c\nd', 503, 100.0)

    class Server:
        class checker:
            backlog = staticmethod(lambda: True)

    text = m.render(Server(), None)
    assert 'dpcdf_http_requests_total{method="GET",route="a\\"b\\\\c\\nd",status="200"} 1' in text
    assert 'le="60.0"} 1' in text and 'le="+Inf"} 2' in text and "dpcdf_check_backlog 1" in text
    assert 'dpcdf_failures_total{where="request"} 1' in text
