"""The server's application in process: the analyst's token is checked before the task is looked
up, and every refusal, validation included, is a 4xx with {"error": message}."""
import warnings

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import x25519

from dpcdf.service.server import create_app
from dpcdf.service.server.limits import Failures, Guard, Limits
from dpcdf.service.task import TaskConfig, token_hash
from helpers import GRID, OPERATOR

with warnings.catch_warnings():  # starlette's TestClient prefers httpx2; httpx works
    warnings.filterwarnings("ignore", message=".*httpx2")
    from fastapi.testclient import TestClient

TOKEN = "the analyst's token"
JSON = {"content-type": "application/json"}
OPERATOR_AUTH = {"authorization": f"Bearer {OPERATOR}"}


@pytest.fixture(scope="module")
def client_and_task(tmp_path_factory):
    client = TestClient(create_app(0, tmp_path_factory.mktemp("app"), warm_up=False))
    own = client.get("/hpke").json()["keys"]["x25519"]
    peer = x25519.X25519PrivateKey.generate().public_key().public_bytes(serialization.Encoding.Raw,
                                                                         serialization.PublicFormat.Raw).hex()
    config = TaskConfig(GRID, 1.0, "tree", "substitution", 0, ("a", "b"), (own, peer), token_hash(TOKEN))
    assert client.post("/tasks", content=config.to_json(), headers=JSON).status_code == 401
    assert client.post("/tasks", content=config.to_json(), headers=JSON | {"authorization": "Bearer x" * 3}).status_code == 403
    assert client.post("/tasks", content=config.to_json(), headers=JSON | OPERATOR_AUTH).status_code == 201
    return client, config.task_id


def test_task_ids_cannot_be_probed_without_the_token(client_and_task):
    client, task_id = client_and_task
    unknown = "0" * 32
    answers = [client.get(f"/tasks/{t}", headers=h) for t in (task_id, unknown)
               for h in ({}, {"authorization": "Basic x"}, {"authorization": "Bearer"})]
    assert {(a.status_code, a.text) for a in answers} == {(401, '{"error":"the analyst\'s bearer token is required"}')}
    for path in (f"/tasks/{unknown}/close", f"/tasks/{unknown}/query"):
        assert client.post(path, content=b'{"kind": "prefix", "indices": [1]}', headers=JSON).status_code == 401
    assert client.get(f"/tasks/{task_id}", headers={"authorization": "Bearer wrong"}).status_code == 401
    probes = [client.get(f"/tasks/{t}", headers={"authorization": f"Bearer {TOKEN}"}) for t in (unknown, "other-task")]
    wrong = client.get(f"/tasks/{task_id}", headers={"authorization": "Bearer made-up"})
    assert {(a.status_code, a.text) for a in probes + [wrong]} == {(401, wrong.text)}  # a made-up token tells nothing
    status = client.get(f"/tasks/{task_id}", headers={"authorization": f"Bearer {TOKEN}"})
    assert status.status_code == 200 and status.json() == {"task_id": task_id, "reports": 0, "closed": False, "min_batch": 0}


@pytest.mark.parametrize("body,message", [
    (b'{"kind": "prefix", "indices": [true]}', "prefix.indices.0: Input should be a valid integer"),
    (b'{"kind": "prefix", "indices": []}', "indices must be a non-empty list"),
    (b'{"kind": "nodes", "level": "1"}', "nodes.level: Input should be a valid integer"),
    (b'{"kind": "groups", "edges": [3, 1]}', "edges must be non-decreasing"),
    (b'[{"kind": "prefix"}]', "kind must be 'prefix', 'nodes'"),
    (b'{"kind": "prefix", "indices": [1]', "the body must be JSON"),
])
def test_invalid_queries_are_400_with_an_error_message(client_and_task, body, message):
    client, task_id = client_and_task
    res = client.post(f"/tasks/{task_id}/query", content=body, headers=JSON | {"authorization": f"Bearer {TOKEN}"})
    assert res.status_code == 400 and set(res.json()) == {"error"} and res.json()["error"].startswith(message)


def test_a_close_that_cannot_reach_server_1_is_a_502_and_leaves_the_task_unanswered(client_and_task):
    client, task_id = client_and_task
    auth = {"authorization": f"Bearer {TOKEN}"}
    first = client.post(f"/tasks/{task_id}/close", headers=auth)
    assert first.status_code == 502 and first.json()["error"].startswith("server 1 did not take part in the close")
    query = client.post(f"/tasks/{task_id}/query", content=b'{"kind": "prefix", "indices": [1]}', headers=JSON | auth)
    assert query.status_code == 409 and "not closed" in query.json()["error"]
    assert client.get("/nowhere").json() == {"error": "Not Found"}


def test_bodies_over_the_limit_are_refused_even_without_a_length():
    """The guard (`limits.Guard`) refuses a body over its endpoint's limit on its Content-Length, and
    a chunked one (no Content-Length) once it passes the chunked cap."""
    async def echo(scope, receive, send):
        body, more = b"", True
        while more:
            message = await receive()
            body, more = body + message.get("body", b""), message.get("more_body", False)
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": body})

    limits = Limits(chunked_bytes=10)
    client = TestClient(Guard(echo, limits=limits, failures=Failures(limits)))
    chunks = lambda n: iter([b"x" * 4] * (n // 4) + [b"x" * (n % 4)])  # noqa: E731 (streamed: no Content-Length)
    assert client.post("/", content=chunks(10)).content == b"x" * 10
    over = client.post("/", content=chunks(11))
    assert over.status_code == 411 and over.json() == {"error": "a body over 10 bytes needs a Content-Length header"}
    assert client.post("/", content=b"x" * (64 << 10)).content == b"x" * (64 << 10)  # with a length: up to 64 KiB here
    assert client.post("/", content=b"x" * (64 << 10 | 1)).status_code == 413  # refused on its Content-Length
    big = client.post("/tasks/t/reports", content=b"x" * (64 << 10 | 1))  # one report: at most 64 KiB
    assert big.status_code == 413 and big.headers["connection"] == "close"