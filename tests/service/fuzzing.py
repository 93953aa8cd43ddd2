"""The fuzzing harness shared by test_fuzz_schema.py and test_fuzz_bodies.py (two modules, so the two
long fuzzing runs go to both test workers): two in-process servers with real reports, the
checks of every answer and of the stored state, and the strategies both modules draw from.

Properties: no 5xx (but the documented 502 of a close whose peer is down), no hang, every 4xx is a
JSON {"error": str}, and no request changes a server's stored state except as it says it did: the
stored reports grow only by the reports an upload acknowledged, no open collection is closed, no
closed report set changes, no task's reconciled mark changes.

Sized for CI: a fixed seed, two thousand requests per fuzzing test, under a minute for each module on
a busy core; HYPOTHESIS_PROFILE=thorough runs ten times as many, with fresh randomness (about four
minutes). A failure names the request; the servers' state carries over from one request to the next,
so a state change may be reported as flaky (hypothesis cannot replay it on the changed state)."""
from __future__ import annotations

import json
import os
import threading
import warnings
from dataclasses import dataclass

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from dpcdf.service.protocols.reconciliation import maths as reconcile
from dpcdf.service.protocols.channel import CHECK, Kind
from dpcdf.service.client import make_reports
from dpcdf.service.server import create_app
from dpcdf.service.server.limits import Limits
from dpcdf.service.task import TaskConfig, token_hash
from dpcdf.service.wire import encode_batch
from helpers import GRID, OPERATOR, values

with warnings.catch_warnings():  # starlette's TestClient prefers httpx2; httpx works
    warnings.filterwarnings("ignore", message=".*httpx2")
    from fastapi.testclient import TestClient

THOROUGH = os.environ.get("HYPOTHESIS_PROFILE") == "thorough"
# 2,000 derandomised examples a fuzzer in CI: each test asserts its examples reached every endpoint's
# accepting and refusing answers, which 1,000 did not always do (a query answered 200 in one of two
# runs: the servers' task tokens differ between runs); HYPOTHESIS_PROFILE=thorough runs 10,000 fresh ones
EXAMPLES = 10_000 if THOROUGH else 2000
FUZZ = settings(max_examples=EXAMPLES, derandomize=not THOROUGH, database=None, deadline=None,
                suppress_health_check=list(HealthCheck))
TIMEOUT = 30.0  # seconds per request: every one of them takes milliseconds here
TOKEN = "the analyst's token for the fuzzed tasks"
OPEN, CLOSED, CALIBRATION = "fuzz-open", "fuzz-closed", "fuzz-calibration"
TASKS = (OPEN, CLOSED, CALIBRATION)
BINARY = {"/tasks/{task_id}/reports", "/tasks/{task_id}/reports/batch", "/tasks/{task_id}/sync", "/tasks/{task_id}/verify"}
PEER_PATHS = {"/tasks/{task_id}/sync", "/tasks/{task_id}/verify"}  # between the servers
CLOSE = "/tasks/{task_id}/close"
ADMIN_CLOSE = "/admin/tasks/{task_id}/close"  # the operator's close: the same 502
# schemathesis cannot break the schema of a request without parameters or of a binary body
ADMIN = {"/admin/tasks", "/admin/tasks/{task_id}", "/admin/tasks/{task_id}/close", "/admin/retention", "/metrics"}
# the operator's purges: with the right token they delete a task's reports, as they say (test_admin and
# test_retention test that); here they get every token but the operator's, so the state check stays exact
PURGES = {"/admin/tasks/{task_id}", "/admin/retention"}
POSITIVE_ONLY = {"/health", "/health/operator", "/hpke", "/admin/tasks", "/admin/retention", "/metrics"} | BINARY
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


def make_world(tmp_path_factory) -> World:
    base = tmp_path_factory.mktemp("fuzz")
    # every limit as deployed but the failure levels: all requests come from one test client, whose
    # junk would get it held back and refused (tests/service/system/test_exhaustion.py tests those)
    # no retention sweep after the one at the start: a query answered on a closed, verified task makes its
    # release final, and a sweep would then delete its reports in the middle of the fuzzing's state checks
    apps = tuple(create_app(party, base / f"server{party}", warm_up=False, limits=FUZZ_LIMITS, sweep_every=1e9)
                 for party in (0, 1))
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
    for state in states:
        assert state.store.marked(config.task_id, "verified") and not state.store.rejections(config.task_id)  # honest reports


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
        assert status == 502 and path in (CLOSE, ADMIN_CLOSE) and party == 0, f"server error: {where}"
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


# --- strategies both fuzzing modules draw from --------------------------------------------------------------
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
