"""The server's application in process: the analyst's token is checked before the task is looked
up, and every refusal, validation included, is a 4xx with {"error": message}."""
import json
import warnings

import numpy as np
import pytest
from pydantic import TypeAdapter
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import x25519

from dpcdf.release import queries as Q
from dpcdf.service.client.analyst import Analyst
from dpcdf.service.server import answers, create_app, models
from dpcdf.service.server.aggregate import Aggregator
from dpcdf.service.server.limits import Failures, Guard, Limits
from dpcdf.service.task import TaskConfig, token_hash
from helpers import GRID, OPERATOR, echo_app

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
    assert status.status_code == 200 and status.json() == {"task_id": task_id, "reports": 0, "closed": False, "min_batch": 0, "checked": 0.0}


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
    echo = echo_app

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

# --- one family of query types: the analyst asks what the server's handlers answer (issue 23) ---------
def _task(mechanism: str, payload: str = "count", bits: int = 6, **extra) -> TaskConfig:
    base = dict(grid={"kind": "uniform", "lo": 0.0, "hi": 1.0, "bits": bits}, epsilon=1.0, mechanism=mechanism,
                relation="substitution", min_batch=0, servers=("http://127.0.0.1:9", "http://127.0.0.1:10"),
                hpke_keys=("00" * 32, "01" * 32), token_hash="00" * 32, payload=payload, task_id="in-process")
    return TaskConfig(**(base | extra))


TASKS = {"path": _task("path"), "tree": _task("tree"), "adaptive": _task("adaptive", bits=8),
         "factorization": _task("factorization", epsilon=None, privacy="zcdp", rho=1.0),
         "calibration": _task("tree", payload="calibration")}


def _served(config: TaskConfig, seen: list) -> Analyst:
    """An analyst whose questions (their JSON) the server's models parse and its handlers answer, with
    two Aggregators over real key shares: no HTTP, the same dispatch as POST /tasks/{id}/query."""
    rng = np.random.default_rng(11)
    values = rng.random(300)
    dcf = config.dcf()
    betas = 1 if config.payload == "count" else np.stack([np.ones(300, np.int64), rng.integers(0, 2, 300),
                                                          rng.integers(0, 1 << 16, 300)], axis=1)
    keys = dcf.gen_batch(config.make_grid().index(values), betas)
    aggs = [Aggregator(dcf, config.make_mechanism(), bytes([party + 1]) * 32, config.task_id) for party in (0, 1)]
    parse = TypeAdapter(models.Query)

    def ask(question: dict):
        q = parse.validate_json(json.dumps(question)).to_query()
        seen.append(q)
        answers.check(q, config, aggs[0])
        shares = [answers.shares(q, config, agg, [k]) for agg, k in zip(aggs, keys)]
        return dcf.reconstruct(shares[0], shares[1], signed=True), values.size

    analyst = Analyst(config, "token")
    analyst._closed, analyst._ask = True, ask
    return analyst


def test_the_analyst_and_the_servers_handlers_speak_the_same_query_types():
    """Every query type goes analyst -> JSON -> the server's model -> the plain type -> its handler, and
    the answers make a release for every mechanism; each type is used by some task."""
    used = set()
    for name, config in TASKS.items():
        seen: list = []
        analyst = _served(config, seen)
        (rel, *_) = analyst.releases()
        assert rel.counts.shape == (config.make_grid().size,), name
        if name == "calibration":
            assert analyst.group_sums([10, 40]).shape == (3, 3)
        assert seen and all(isinstance(q, Q.QUERY_TYPES) for q in seen), name
        used |= {type(q) for q in seen}
    assert used == set(Q.QUERY_TYPES)


def _old_rule(config: TaskConfig, mech, q) -> str | None:
    """The router's isinstance chain before the query types (the oracle): its refusal, or None."""
    adaptive, size = config.mechanism == "adaptive", mech.size
    if isinstance(q, Q.BinsQuery) != adaptive and not (adaptive and isinstance(q, Q.NodesQuery)):
        return answers.ADAPTIVE_ONLY
    if isinstance(q, Q.BinsQuery):
        return None if (q.round == 2) == (q.ends is not None) else "round 1's bins"
    if isinstance(q, Q.CoordinatesQuery) != (not mech.answers_prefixes and not adaptive):
        return answers.FACTORIZATION_ONLY
    if isinstance(q, Q.CoordinatesQuery):
        return None
    if isinstance(q, Q.GroupsQuery):
        if config.payload != "calibration":
            return answers.KINDS
        return None if all(0 <= e < size - 1 for e in q.edges) else "edges must be"
    if isinstance(q, Q.PrefixQuery):
        return None if all(0 <= i < size for i in q.indices) else "indices must be"
    ok = config.mechanism in ("tree", "adaptive") and q.level in mech.released_levels()
    return None if ok else "node queries need"


QUERIES = [Q.PrefixQuery([0, 63]), Q.PrefixQuery([64]), Q.NodesQuery(0), Q.NodesQuery(1), Q.NodesQuery(99),
           Q.CoordinatesQuery(), Q.BinsQuery(1), Q.BinsQuery(1, [255]), Q.BinsQuery(2), Q.GroupsQuery([3, 9]),
           Q.GroupsQuery([63])]


@pytest.mark.parametrize("name", TASKS)
def test_a_tasks_refusals_are_the_routers_before(name):
    config = TASKS[name]
    agg = Aggregator(config.dcf(), config.make_mechanism(), b"\x01" * 32, config.task_id)
    for q in QUERIES:
        want = _old_rule(config, agg.mechanism, q)
        if want is None:
            answers.check(q, config, agg)
        else:
            with pytest.raises(answers.QueryRefused) as refused:
                answers.check(q, config, agg)
            assert str(refused.value).startswith(want), (name, q)


def test_a_refused_query_is_a_400_with_its_message(client_and_task):
    client, task_id = client_and_task
    auth = JSON | {"authorization": f"Bearer {TOKEN}"}
    for body, message in ((b'{"kind": "bins", "round": 1}', answers.ADAPTIVE_ONLY),
                          (b'{"kind": "coordinates"}', answers.FACTORIZATION_ONLY),
                          (b'{"kind": "groups", "edges": [1]}', answers.KINDS),
                          (b'{"kind": "prefix", "indices": [1, 99999]}', "indices must be a non-empty list of grid indices in [0, ")):
        res = client.post(f"/tasks/{task_id}/query", content=body, headers=auth)
        assert res.status_code == 400 and res.json()["error"].startswith(message), body


def test_every_query_type_has_one_handler_and_nothing_else_does():
    assert set(answers._HANDLERS) == set(Q.QUERY_TYPES) == set(models.MODELS)
    assert len({id(h) for h in answers._HANDLERS.values()}) == len(Q.QUERY_TYPES)
    with pytest.raises(answers.QueryRefused, match="kind must be"):
        answers.handler({"kind": "prefix", "indices": [1]})  # a dict is no query: the server parses first


def test_a_data_directory_serves_the_party_its_tasks_name_it(tmp_path):
    from dpcdf.errors import DpcdfError
    from dpcdf.service.server.ownership import claim_party

    d = tmp_path / "srv"
    d.mkdir()
    claim_party(d, 1, [], "ab" * 32)
    claim_party(d, 0, [], "ab" * 32)  # no task yet: either party (a first start with the wrong one is no harm)
    mine, other = "cd" * 32, "ef" * 32
    configs = [json.dumps({"hpke_keys": [other, "00" * 1184 + mine]})]  # server 1's key, in an ML-KEM hybrid's tail
    with pytest.raises(DpcdfError, match="holds server 1's keys and store .* start it with --party 1"):
        claim_party(d, 0, configs, mine)
    claim_party(d, 1, configs, mine)
    claim_party(d, 0, [json.dumps({"hpke_keys": [other, "12" * 32]})], mine)  # tasks that do not name it: no claim
    assert list(d.iterdir()) == []  # nothing recorded: the tasks are the record
