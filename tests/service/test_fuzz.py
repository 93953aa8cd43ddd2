"""The HTTP API fuzzed (issue 11): every endpoint of the server's OpenAPI schema, driven with
schemathesis' generated and schema-violating requests plus our own mutated binary bodies (truncated,
bit-flipped, extended, spliced reports, batches and reconciliation messages, and random bytes), with
random, wrong and right bearer tokens and random and real task ids in the path, against two real
in-process servers whose tasks hold real reports.

Properties: no 5xx (but the documented 502 of a close whose peer is down), no hang, every 4xx is a
JSON {"error": str}, and no request changes a server's stored state except as it says it did: the
stored reports grow only by the reports an upload acknowledged, no open collection is closed, no
closed report set changes, no task's reconciled mark changes.

Sized for CI: a fixed seed, a thousand requests per fuzzing test, under a minute for the file on two
busy cores; HYPOTHESIS_PROFILE=thorough runs ten times as many, with fresh randomness (about four
minutes). A failure names the request; the servers' state carries over from one request to the next,
so a state change may be reported as flaky (hypothesis cannot replay it on the changed state)."""
from __future__ import annotations

import json
import os
import struct
import threading
import time
import warnings
from dataclasses import dataclass

import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode

from dpcdf.service.protocols.reconciliation import maths as reconcile
from dpcdf.service.protocols.channel import CHECK, Kind
from dpcdf.service.client import make_reports
from dpcdf.service.server import create_app
from dpcdf.service.server.limits import Limits
from dpcdf.service.task import TaskConfig, token_hash
from dpcdf.service.wire import MAX_BATCH, Report, encode_batch
from helpers import GRID, OPERATOR, values

with warnings.catch_warnings():  # starlette's TestClient prefers httpx2; httpx works
    warnings.filterwarnings("ignore", message=".*httpx2")
    from fastapi.testclient import TestClient

# schemathesis' negative strategies hold the whole schema: hypothesis warns when it draws them by name
pytestmark = pytest.mark.filterwarnings("ignore:Generating overly large repr:hypothesis.errors.HypothesisWarning")
THOROUGH = os.environ.get("HYPOTHESIS_PROFILE") == "thorough"
EXAMPLES = 2000 * (5 if THOROUGH else 1)
FUZZ = settings(max_examples=EXAMPLES, derandomize=not THOROUGH, database=None, deadline=None,
                suppress_health_check=list(HealthCheck))
TIMEOUT = 30.0  # seconds per request: every one of them takes milliseconds here
TOKEN = "the analyst's token for the fuzzed tasks"
OPEN, CLOSED, CALIBRATION = "fuzz-open", "fuzz-closed", "fuzz-calibration"
TASKS = (OPEN, CLOSED, CALIBRATION)
BINARY = {"/tasks/{task_id}/reports", "/tasks/{task_id}/reports/batch", "/tasks/{task_id}/sync", "/tasks/{task_id}/verify"}
PEER_PATHS = {"/tasks/{task_id}/sync", "/tasks/{task_id}/verify"}  # between the servers
CLOSE = "/tasks/{task_id}/close"
# schemathesis cannot break the schema of a request without parameters or of a binary body
POSITIVE_ONLY = {"/health", "/health/operator", "/hpke"} | BINARY
FUZZ_LIMITS = Limits(slow_level=1e9, refuse_level=2e9)


@dataclass
class World:
    """Two servers (party 0 and 1) with the same three tasks: OPEN (a collection that stays open: its
    min_batch is out of reach, so a close is refused before it freezes anything), CLOSED and
    CALIBRATION (closed and reconciled, so an analyst's queries are answered from real shares)."""
    apps: tuple
    configs: dict
    stored: list  # report bytes both servers hold for OPEN
    fresh: list  # valid reports for OPEN that no server has seen yet
    sync_messages: list  # genuine server-0 messages of the OPEN task (round 1 and 3)

    def snapshot(self, party: int) -> dict:
        store = self.apps[party].state.server.store
        return {t: (store.count(t), store.frozen(t), store.marked(t, "reconciled")) for t in TASKS}

    def __repr__(self) -> str:
        return "World(two servers, tasks %s)" % (TASKS,)


def _register(client: TestClient, config: TaskConfig) -> None:
    res = client.post("/tasks", content=config.to_json(),
                      headers={"content-type": "application/json", "authorization": f"Bearer {OPERATOR}"})
    assert res.status_code == 201, res.text


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> World:
    base = tmp_path_factory.mktemp("fuzz")
    # every limit as deployed but the failure levels: all requests come from one test client, whose
    # junk would get it held back and refused (tests/service/system/test_exhaustion.py tests those)
    apps = tuple(create_app(party, base / f"server{party}", warm_up=False, limits=FUZZ_LIMITS) for party in (0, 1))
    clients = [TestClient(app) for app in apps]
    keys = {kem: tuple(c.get("/hpke").json()["keys"][kem] for c in clients) for kem in ("x25519", "mlkem768-x25519")}
    servers = ("a", "b")  # not URLs: a close that gets as far as calling server 1 fails at once (502)
    configs = {
        OPEN: TaskConfig(GRID, 1.0, "tree", "substitution", 10**9, servers, keys["x25519"], token_hash(TOKEN), task_id=OPEN),
        CLOSED: TaskConfig(GRID, 1.0, "tree", "substitution", 0, servers, keys["x25519"], token_hash(TOKEN), task_id=CLOSED),
        CALIBRATION: TaskConfig({"kind": "uniform", "lo": 0.0, "hi": 1.0, "bits": 5}, 1.0, "path", "substitution", 0, servers,
                                keys["mlkem768-x25519"], token_hash(TOKEN), payload="calibration", kem="mlkem768-x25519",
                                task_id=CALIBRATION),
    }
    reports = {OPEN: make_reports(configs[OPEN], values(40, 3)), CLOSED: make_reports(configs[CLOSED], values(12, 4)),
               CALIBRATION: make_reports(configs[CALIBRATION], values(12, 5) / 100, [0, 1] * 6)}
    stored = [r.to_bytes() for r in reports[OPEN][:8]]
    for party, client in enumerate(clients):
        for task_id, config in configs.items():
            _register(client, config)
            body = stored if task_id == OPEN else [r.to_bytes() for r in reports[task_id]]
            res = client.post(f"/tasks/{task_id}/reports/batch", content=encode_batch(body))
            assert res.status_code == 200 and res.json()["accepted"] == len(body), res.text
        srv = apps[party].state.server
        for task_id in (CLOSED, CALIBRATION):  # closed and reconciled, as a close with an agreeing peer leaves them
            srv.store.freeze(task_id, srv.task(task_id).set_hash)
            srv.store.mark(task_id, "reconciled")
    for task_id in (CLOSED, CALIBRATION):  # and verified: the report check run between the two in-process servers
        _check_reports(apps, configs[task_id])
    st0 = apps[0].state.server.task(OPEN)
    ids = [r.report_id for r in reports[OPEN][:8]]
    first = st0.channel.seal(Kind.DIGESTS, 0, reconcile.bucket_digests(st0.pair_key, ids))
    last = st0.channel.seal(Kind.DROPS, 0, reconcile.id_list(ids[:1]))
    return World(apps, configs, stored, [r.to_bytes() for r in reports[OPEN][8:]], [first, last])


def _check_reports(apps, config: TaskConfig) -> None:
    """The close's report check (`protocols.check.exchange`) between two in-process servers, messages
    passed directly."""
    states = [app.state.server.task(config.task_id) for app in apps]
    helper = states[1].helper()
    states[0].check_leader().run(lambda m: helper.answer(states[1].channel.open(m, CHECK, helper.context)))
    for st in states:
        assert st.store.marked(config.task_id, "verified") and not st.store.rejections(config.task_id)  # honest reports


# --- sending a request and checking its answer -----------------------------------------------------------
def send(call, *args, timeout: float = TIMEOUT, **kwargs):
    """`call(*args, **kwargs)` in a worker thread, failing the test if it takes over `timeout` seconds
    (a daemon thread: a hung request does not hold up the end of the test run either). An exception
    the server lets through (an unhandled error in a handler) reaches the caller here."""
    outcome: dict = {}

    def run() -> None:
        try:
            outcome["value"] = call(*args, **kwargs)
        except BaseException as exc:  # noqa: BLE001 (handed to the caller)
            outcome["error"] = exc

    worker = threading.Thread(target=run, name="fuzz-request", daemon=True)
    worker.start()
    worker.join(timeout)
    if worker.is_alive():
        raise AssertionError(f"no answer within {timeout} s: the server hangs")
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


def content_type(headers) -> str:
    value = next((v for k, v in headers.items() if k.lower() == "content-type"), "")
    return value[0] if isinstance(value, list) else value  # schemathesis' headers are lists


def check_answer(status: int, content_type: str, body: bytes, *, path: str, party: int) -> int:
    """The answer's properties; returns the number of reports it acknowledges."""
    where = f"server {party}, {path}: {status} {body[:300]!r}"
    if status >= 500:
        # the only 5xx: a close that cannot reach server 1 (documented: "the other server did not answer")
        assert status == 502 and path == CLOSE and party == 0, f"server error: {where}"
    if status >= 400:
        assert content_type.split(";")[0].strip() == "application/json", f"refusal not JSON: {where}"
        answer = json.loads(body)
        assert isinstance(answer, dict) and set(answer) == {"error"} and isinstance(answer["error"], str) \
            and answer["error"], f"refusal not {{'error': str}}: {where}"
        return 0
    assert 200 <= status < 300, f"unexpected status: {where}"
    if path in BINARY - PEER_PATHS:
        return json.loads(body)["accepted"]
    return 0


def check_state(world: World, party: int, before: dict, acknowledged: int, what: str) -> None:
    """The stored state changed only as the answer said: as many new reports as acknowledged, no
    collection closed or reopened, no report set changed, nothing marked reconciled."""
    after = world.snapshot(party)
    grown = sum(after[t][0] - before[t][0] for t in TASKS)
    assert grown == acknowledged, f"server {party} stored {grown} reports, acknowledged {acknowledged}: {what}"
    for t in TASKS:
        assert after[t][1:] == before[t][1:], f"server {party}, task {t}: {before[t]} -> {after[t]} after {what}"


# --- requests from the OpenAPI schema ----------------------------------------------------------------------
@pytest.fixture(scope="module")
def operations(world):
    schema = schemathesis.openapi.from_asgi("/openapi.json", world.apps[0])
    ops = [result.ok() for result in schema.get_all_operations()]
    assert {op.path for op in ops} == {"/health", "/health/operator", "/hpke", "/tasks", "/tasks/{task_id}", CLOSE, "/tasks/{task_id}/query"} | BINARY
    strategies = []
    for op in ops:
        # the deepest code (the aggregation) and the close, which its coverage check below needs reached with
        # a right token (once in a full CI run, after the schema grew, 1,000 derandomised examples never did)
        weight = 3 if op.path in ("/tasks/{task_id}/query", CLOSE) else 1
        strategies += [op.as_strategy(generation_mode=GenerationMode.POSITIVE)] * weight
        if op.path not in POSITIVE_ONLY:
            strategies.append(op.as_strategy(generation_mode=GenerationMode.NEGATIVE))
    return Strategies(strategies)


class Strategies(list):
    def __repr__(self) -> str:  # not hypothesis' repr of the whole schema once per operation
        return f"<{len(self)} schemathesis strategies>"


RIGHT = [f"Bearer {TOKEN}", f"Bearer {OPERATOR}"]
WRONG = ["Bearer", "Bearer ", "Basic dXNlcjpwYXNz", f"bearer {TOKEN}", f"Bearer {TOKEN} ", f"Bearer  {TOKEN}",
         f"Bearer {TOKEN[:-1]}", f"Bearer {OPERATOR}x", f"Bearer {TOKEN},Bearer {OPERATOR}", ""]
# the Authorization header: None keeps schemathesis' (often a random bearer token), "DROP" sends none
AUTH = st.one_of(
    st.just(RIGHT[0]), st.just(RIGHT[0]), st.just(RIGHT[1]),
    st.sampled_from(WRONG + ["DROP"]), st.just(None),
    st.text(st.characters(codec="latin-1", exclude_characters="\r\n"), max_size=40).map(lambda s: f"Bearer {s}"),
)
RANDOM_IDS = st.one_of(
    st.sampled_from(("unknown-task", "0" * 32, "x" * 65, "fuzz-open%00", "fuzz%2Dopen", "FUZZ-OPEN", "fuzz-open%20", "..")),
    st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), min_size=1, max_size=20).map(
        lambda s: "".join(c if c.isalnum() or c in "-_" else f"%{ord(c):02X}" if ord(c) < 128 else c for c in s)))
REAL_IDS = st.sampled_from((CLOSED, CALIBRATION, OPEN))
TASK_IDS = st.one_of(REAL_IDS, REAL_IDS, RANDOM_IDS)


JSON = st.recursive(st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats(allow_nan=False, allow_infinity=False)
                    | st.text(max_size=12),
                    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
                    max_leaves=8)
FLOATS = st.floats(allow_nan=False, allow_infinity=False) | st.sampled_from([0.0, -0.0, 1e-300, 1e300, 5e-324, 1.0, 100.0])
NEAR = {  # values near the valid ones, per field of a task config
    "epsilon": FLOATS, "split": FLOATS, "min_batch": st.integers(-2, 2**64),
    "mechanism": st.sampled_from(["path", "tree", "adaptive", "Tree", ""]), "relation": st.sampled_from(["substitution", "add-remove", "x"]),
    "payload": st.sampled_from(["count", "label", "calibration", "labels"]),
    "kem": st.sampled_from(["x25519", "mlkem768-x25519", "X25519", "mlkem"]),
    "servers": st.lists(st.sampled_from(["a", "http://127.0.0.1:9", ""]), max_size=3),
    "hpke_keys": st.lists(st.text("0123456789abcdef", max_size=70), max_size=3),
    "grid.kind": st.sampled_from(["uniform", "log", "thresholds", "integers"]),
    "grid.lo": FLOATS, "grid.hi": FLOATS, "grid.bits": st.integers(-2, 40),
    "grid.values": st.lists(FLOATS, max_size=40) | st.just(list(range(5))),
}
FIELDS = sorted(NEAR) + ["task_id", "token_hash", "format", "grid"]


@st.composite
def task_configs(draw, world):
    """A valid task config (for either server: it names both servers' keys) with a new id, with up to
    three fields changed to a nearby value, any JSON value, or left out."""
    config = json.loads(world.configs[OPEN].to_json())
    config["task_id"] = "fz-" + draw(st.text("abcdefghij", min_size=1, max_size=12))
    for name in draw(st.lists(st.sampled_from(FIELDS), max_size=3)):
        holder, key = (config.get("grid"), name[5:]) if name.startswith("grid.") else (config, name)
        if not isinstance(holder, dict):
            continue
        value = draw(st.one_of(NEAR.get(name, JSON), JSON, st.just(KeyError)))
        if value is KeyError:
            holder.pop(key, None)
        else:
            holder[key] = value
    return config


VALID_PREFIX = st.fixed_dictionaries({"kind": st.just("prefix"), "indices": st.lists(st.integers(0, 63), min_size=1, max_size=8)})
QUERIES = st.one_of(  # a valid prefix query twice: the coverage check needs a 200 from the query among ten kinds of body
    VALID_PREFIX, VALID_PREFIX,
    st.fixed_dictionaries({"kind": st.just("prefix"), "indices": st.lists(st.integers(-3, 70), max_size=8)}),
    st.fixed_dictionaries({"kind": st.just("nodes"), "level": st.integers(-2, 12)}),
    st.just({"kind": "coordinates"}),  # a factorization task's only question; refused (400) by the others
    st.one_of(st.fixed_dictionaries({"kind": st.just("bins"), "round": st.integers(0, 3)}),  # adaptive tasks' only
              st.fixed_dictionaries({"kind": st.just("bins"), "round": st.just(2),  # questions (with their nodes)
                                     "ends": st.lists(st.integers(-2, 70), max_size=6)})),
    st.fixed_dictionaries({"kind": st.just("groups"), "edges": st.lists(st.integers(0, 31), max_size=6).map(sorted)}),
    st.fixed_dictionaries({"kind": st.just("groups"), "edges": st.lists(st.integers(-2, 40), max_size=6)}),
    st.builds(lambda: {"kind": "prefix", "indices": [0] * ((1 << 16) + 1)}),  # over the limit
    st.builds(lambda: {"kind": "prefix", "indices": list(range(64)) * 1024}),  # at it
)


@st.composite
def schema_requests(draw, strategies, world):
    """schemathesis' request for one operation; then often a real task id in the path, a right or
    wrong bearer token, and (queries, registrations) a body that is valid or nearly so."""
    case = draw(st.sampled_from(strategies).flatmap(lambda s: s))
    if "task_id" in case.path_parameters and draw(st.integers(0, 4)) > 0:
        case.path_parameters["task_id"] = draw(TASK_IDS)
    auth = draw(AUTH)
    if auth == "DROP":
        case.headers.pop("Authorization", None)
    elif auth is not None:
        case.headers["Authorization"] = auth
    if case.path in ("/tasks", "/tasks/{task_id}/query") and draw(st.integers(0, 2)) > 0:
        case.body = draw(task_configs(world) if case.path == "/tasks" else QUERIES)
        case.media_type = "application/json"
    return case, draw(st.integers(0, 1))


def test_requests_from_the_schema(world, operations):
    """schemathesis' requests for every operation, valid and schema-violating, with our tokens and
    task ids mixed in, against either server."""
    seen: set[tuple[str, int]] = set()

    @FUZZ
    @given(schema_requests(operations, world))
    def run(drawn):
        case, party = drawn
        before = world.snapshot(party)
        try:
            res = send(case.call, app=world.apps[party])
        except requests.exceptions.InvalidHeader:
            return  # the client cannot send this header: no request reached the server
        seen.add((case.path, res.status_code))
        acknowledged = check_answer(res.status_code, content_type(res.headers), res.content,
                                    path=case.path, party=party)
        check_state(world, party, before, acknowledged, f"{case.method} {case.formatted_path} {dict(case.headers)}")

    run()
    # the fuzzer got past the tokens: the analyst's and the operator's endpoints answered it, or refused
    # it for what it asked (not for its token), and they refused wrong tokens
    reached = {path: {status for p, status in seen if p == path} for path, _ in seen}
    assert 200 in reached["/tasks/{task_id}"] and 401 in reached["/tasks/{task_id}"], reached
    assert {200, 400} <= reached["/tasks/{task_id}/query"], reached
    assert reached[CLOSE] & {200, 403, 502}, reached
    assert {400, 403} <= reached["/tasks"] and 400 in reached["/tasks/{task_id}/sync"], reached


# --- our own binary bodies ----------------------------------------------------------------------------------
def mutated(data: bytes) -> st.SearchStrategy[bytes]:
    """`data` changed: cut short, one bit flipped, bytes appended, or a slice replaced."""
    n = len(data)

    def flip(at_bit):
        at, bit = at_bit
        return data[:at] + bytes([data[at] ^ (1 << bit)]) + data[at + 1:]

    def splice(args):
        at, size, new = args
        out = data[:at] + new + data[at + size:]
        return out if out != data else data + b"\x00"

    return st.one_of(
        st.integers(0, n - 1).map(lambda k: data[:k]),
        st.tuples(st.integers(0, n - 1), st.integers(0, 7)).map(flip),
        st.binary(min_size=1, max_size=16).map(lambda extra: data + extra),
        st.tuples(st.integers(0, n - 1), st.integers(0, 8), st.binary(max_size=8)).map(splice),
    )


def report_bodies(world: World) -> st.SearchStrategy[bytes]:
    known = world.stored + world.fresh
    return st.one_of(st.binary(max_size=300), st.sampled_from(known).flatmap(mutated), st.sampled_from(known))


def batch_bodies(world: World) -> st.SearchStrategy[bytes]:
    reports = report_bodies(world)
    return st.one_of(
        st.lists(reports, max_size=6).map(encode_batch),
        st.lists(st.sampled_from(world.stored + world.fresh), min_size=1, max_size=6).map(encode_batch).flatmap(mutated),
        st.tuples(st.sampled_from([MAX_BATCH, MAX_BATCH + 1, 2**32 - 1, 3]), st.binary(max_size=64)).map(
            lambda c: struct.pack("<I", c[0]) + c[1]),
        st.tuples(st.sampled_from(world.stored), st.sampled_from([0, 2**31, 2**32 - 1])).map(
            lambda r: struct.pack("<II", 1, r[1]) + r[0]),
        st.binary(max_size=64),
    )


def sync_bodies(world: World) -> st.SearchStrategy[bytes]:
    return st.one_of(
        st.sampled_from(world.sync_messages).flatmap(mutated),
        st.tuples(st.sampled_from([0, 1, 2, 3, 4, 255]), st.binary(max_size=80)).map(lambda m: bytes([m[0]]) + m[1]),
        st.binary(max_size=64),
    )


def raw_json(values: st.SearchStrategy) -> st.SearchStrategy[bytes]:
    """JSON text as a client may send it: with NaN and Infinity (Python's json reads them), cut
    short, or in another encoding."""
    def nonfinite(v):
        if isinstance(v, dict):
            return {k: nonfinite(x) for k, x in v.items()}
        return float("nan") if isinstance(v, float) and v == 1.0 else float("inf") if v == 100.0 else v

    text = values.map(lambda v: json.dumps(nonfinite(v)).encode())
    return st.one_of(text, text.flatmap(mutated), text.map(lambda b: b.decode().encode("utf-16")))


@st.composite
def binary_requests(draw, world):
    path = draw(st.sampled_from(sorted(BINARY) * 2 + ["/tasks", "/tasks/{task_id}/query"]))
    body = draw({"/tasks/{task_id}/reports": report_bodies, "/tasks/{task_id}/reports/batch": batch_bodies,
                 "/tasks/{task_id}/sync": sync_bodies, "/tasks/{task_id}/verify": sync_bodies,
                 "/tasks": lambda w: raw_json(task_configs(w)),
                 "/tasks/{task_id}/query": lambda w: raw_json(QUERIES)}[path](world))
    task_id = draw(st.one_of(st.sampled_from(TASKS), TASK_IDS))
    party = draw(st.sampled_from([0, 1, 1] if path in PEER_PATHS else [0, 1]))
    headers = {}
    if draw(st.booleans()):
        headers["content-type"] = draw(st.sampled_from(["application/octet-stream", "application/json", "text/plain", ""]))
    auth = draw(AUTH)
    if auth not in (None, "DROP"):
        headers["authorization"] = auth
    return path, task_id, party, {k: v.encode("latin-1") for k, v in headers.items()}, body


def test_mutated_raw_bodies(world):
    """Uploads and reconciliation messages: valid ones (fresh reports are acknowledged and stored),
    and truncated, bit-flipped, extended, spliced and random ones, which must all be refused (400;
    404 for an unknown task, 409 on a closed one) and change nothing; and raw JSON for registrations
    and queries, with NaN and Infinity, cut short or UTF-16."""
    clients = [TestClient(app) for app in world.apps]
    seen: set[tuple[str, int]] = set()
    known = [Report.from_bytes(r) for r in world.stored + world.fresh]
    genuine = [{(r.report_id, r.sealed[party]) for r in known} for party in (0, 1)]

    @FUZZ
    @given(binary_requests(world))
    def run(drawn):
        path, task_id, party, headers, body = drawn
        before = world.snapshot(party)
        res = send(clients[party].post, path.replace("{task_id}", task_id), content=body, headers=headers)
        seen.add((path, res.status_code))
        acknowledged = check_answer(res.status_code, content_type(res.headers), res.content, path=path, party=party)
        check_state(world, party, before, acknowledged, f"POST {path} {task_id!r} {body[:80]!r}")
        if res.status_code < 300 and path.endswith("reports"):  # acknowledged: this server's share is genuine
            report = Report.from_bytes(body)  # (the other server's may be changed: it refuses it, and
            assert (report.report_id, report.sealed[party]) in genuine[party]  # reconciliation drops it here)

    run()
    reached = {path: {status for p, status in seen if p == path} for path, _ in seen}
    assert {400, 404} <= reached["/tasks/{task_id}/reports"] and reached["/tasks/{task_id}/reports"] & {201, 409}, reached
    assert {200, 400} <= reached["/tasks/{task_id}/reports/batch"] and 400 in reached["/tasks/{task_id}/sync"], reached
    assert {400, 403} <= reached["/tasks"] and 400 in reached["/tasks/{task_id}/query"], reached


# --- the harness catches what it is meant to ------------------------------------------------------------------
def test_the_checks_catch_a_server_error_and_a_bare_refusal(tmp_path):
    """A handler that raises is reported (not taken for a refusal), as are a 500 and a refusal
    without the {"error": str} body, and a state change no answer accounts for."""
    app = create_app(0, tmp_path, warm_up=False)

    @app.get("/boom")
    def boom():
        raise RuntimeError("a bug")

    @app.get("/slow")
    def slow():
        time.sleep(3)

    with pytest.raises(RuntimeError, match="a bug"):
        send(TestClient(app).get, "/boom")
    with pytest.raises(AssertionError, match="hangs"):
        send(TestClient(app).get, "/slow", timeout=0.5)
    with pytest.raises(AssertionError, match="server error"):
        check_answer(500, "application/json", b'{"error": "x"}', path="/tasks/{task_id}/reports", party=0)
    with pytest.raises(AssertionError, match="server error"):
        check_answer(502, "application/json", b'{"error": "x"}', path=CLOSE, party=1)
    with pytest.raises(AssertionError, match="not JSON"):
        check_answer(404, "text/plain", b"Not Found", path="/tasks", party=0)
    with pytest.raises(AssertionError, match="not {'error': str}"):
        check_answer(400, "application/json", b'{"detail": "x"}', path="/tasks", party=0)
    assert check_answer(201, "application/json", b'{"accepted": 1}', path="/tasks/{task_id}/reports", party=0) == 1


# --- what the fuzzing found --------------------------------------------------------------------------------------
def test_a_forged_sync_message_does_not_close_server_1s_collection(world):
    """Found by the fuzzer: server 1 froze the task (closed its collection for good) before it
    checked that the sync message opens, so anyone could close it with any bytes."""
    client = TestClient(world.apps[1])
    genuine = world.sync_messages[0]
    forged = (genuine[:-1] + bytes([genuine[-1] ^ 1]), b"\x01" + bytes(60), b"junk", b"")
    for body in forged:
        res = client.post(f"/tasks/{OPEN}/sync", content=body, headers={"content-type": "application/octet-stream"})
        assert res.status_code == 400 and set(res.json()) == {"error"}, res.text
    assert world.apps[1].state.server.store.frozen(OPEN) is None
    new = make_reports(world.configs[OPEN], [50.0])[0].to_bytes()
    assert client.post(f"/tasks/{OPEN}/reports", content=new).status_code == 201  # still collecting


def test_the_state_check_catches_a_report_no_answer_acknowledged(world):
    before = world.snapshot(0)
    new = make_reports(world.configs[OPEN], [25.0])[0].to_bytes()
    assert TestClient(world.apps[0]).post(f"/tasks/{OPEN}/reports", content=new).status_code == 201
    with pytest.raises(AssertionError, match="stored 1 reports, acknowledged 0"):
        check_state(world, 0, before, 0, "a test")
    check_state(world, 0, before, 1, "a test")
