"""The HTTP API fuzzed (issue 11), part one: every endpoint of the server's OpenAPI schema, driven
with schemathesis' generated and schema-violating requests, with random, wrong and right bearer tokens
and random and real task ids in the path, against two real in-process servers whose tasks hold real
reports (the harness and its properties: fuzzing.py; our own binary bodies: test_fuzz_bodies.py).
Plus the tests that the harness catches what it is meant to."""
from __future__ import annotations

import time

import pytest
import requests
import schemathesis
from hypothesis import given
from hypothesis import strategies as st
from schemathesis import GenerationMode

from dpcdf.service.server import create_app
from fuzzing import (ADMIN, AUTH, BINARY, CLOSE, OPERATOR, PURGES, WRONG, FUZZ, OPEN, POSITIVE_ONLY, QUERIES, TASK_IDS, TestClient, World, check_answer,
                     check_state, content_type, make_world, send, task_configs)
from dpcdf.service.client import make_reports

pytestmark = pytest.mark.filterwarnings("ignore:Generating overly large repr:hypothesis.errors.HypothesisWarning")


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> World:
    return make_world(tmp_path_factory)


# --- requests from the OpenAPI schema ----------------------------------------------------------------------
@pytest.fixture(scope="module")
def operations(world):
    schema = schemathesis.openapi.from_asgi("/openapi.json", world.apps[0])
    ops = [result.ok() for result in schema.get_all_operations()]
    assert {op.path for op in ops} == {"/health", "/health/operator", "/hpke", "/tasks", "/tasks/{task_id}", CLOSE,
                                       "/tasks/{task_id}/query"} | BINARY | ADMIN
    strategies = []
    for op in ops:
        # the deepest code (the aggregation) and the close, which its coverage check below needs reached with
        # a right token (once in a full CI run, after the schema grew, 1,000 derandomised examples never did),
        # and the operator's two reads (in one full run of 2,000, /admin/tasks never met the operator's token)
        weight = 3 if op.path in ("/tasks/{task_id}/query", CLOSE, "/admin/tasks", "/metrics") else 1
        strategies += [op.as_strategy(generation_mode=GenerationMode.POSITIVE)] * weight
        if op.path not in POSITIVE_ONLY:
            strategies.append(op.as_strategy(generation_mode=GenerationMode.NEGATIVE))
    return Strategies(strategies)


class Strategies(list):
    def __repr__(self) -> str:  # not hypothesis' repr of the whole schema once per operation
        return f"<{len(self)} schemathesis strategies>"




@st.composite
def schema_requests(draw, strategies, configs):
    """schemathesis' request for one operation; then often a real task id in the path, a right or
    wrong bearer token, and (queries, registrations) a body that is valid or nearly so (`configs`:
    the registrations' strategy, built once, not validated again on every draw)."""
    case = draw(st.sampled_from(strategies).flatmap(lambda s: s))
    if "task_id" in case.path_parameters and draw(st.integers(0, 4)) > 0:
        case.path_parameters["task_id"] = draw(TASK_IDS)
    auth = draw(AUTH)
    if case.path in PURGES and auth == f"Bearer {OPERATOR}":
        auth = draw(st.sampled_from(WRONG))
    if auth == "DROP":
        case.headers.pop("Authorization", None)
    elif auth is not None:
        case.headers["Authorization"] = auth
    if case.path in ("/tasks", "/tasks/{task_id}/query") and draw(st.integers(0, 2)) > 0:
        case.body = draw(configs if case.path == "/tasks" else QUERIES)
        case.media_type = "application/json"
    return case, draw(st.integers(0, 1))


def test_requests_from_the_schema(world, operations):
    """schemathesis' requests for every operation, valid and schema-violating, with our tokens and
    task ids mixed in, against either server."""
    seen: set[tuple[str, int]] = set()

    @FUZZ
    @given(schema_requests(operations, task_configs(world)))
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
    assert {400, 403} <= reached["/tasks"] and 401 in reached["/tasks/{task_id}/sync"], reached  # no request tag
    assert {200, 401} <= reached["/admin/tasks"] and {200, 401} <= reached["/metrics"], reached  # the operator's
    assert reached["/admin/tasks/{task_id}"] <= {401, 403, 404, 422}, reached  # no purge went through


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


def test_the_state_check_catches_a_report_no_answer_acknowledged(world):
    before = world.snapshot(0)
    new = make_reports(world.configs[OPEN], [25.0])[0].to_bytes()
    assert TestClient(world.apps[0]).post(f"/tasks/{OPEN}/reports", content=new).status_code == 201
    with pytest.raises(AssertionError, match="stored 1 reports, acknowledged 0"):
        check_state(world, 0, before, 0, "a test")
    check_state(world, 0, before, 1, "a test")
