"""No one request stalls the server (issue 11): one task's slow work does not hold up another task's
requests, the tree plan is computed once, and one analyst's expensive requests are limited (429).

Real server processes; the bounds are generous (CI shares 2 busy cores), and overlap is shown with
timestamps rather than tight timings."""
import json
import threading
import time
import urllib.error
import urllib.request

import numpy as np
import pytest

from dpcdf.analyst import Analyst
from dpcdf.errors import DpcdfError
from dpcdf.release.mechanisms import TreeMechanism, tree_plan
from dpcdf.release.mechanisms.accounting import _covering_counts
from dpcdf.release.tree import TreeShape
from dpcdf.service.client import create_task, submit
from dpcdf.service.http import http
from dpcdf.service.processes import start_server, stop
from dpcdf.service.server import state as state_module
from dpcdf.service.server.errors import TaskNotFound, status_of
from dpcdf.service.server.state import Server, Throttled
from dpcdf.service.task import TaskConfig, token_hash
from helpers import OPERATOR

GRID17 = {"kind": "uniform", "lo": 0.0, "hi": 1.0, "bits": 17}  # past GRID_SUMS_MAX: a query evaluates the keys (slow
# enough to overlap; on 2^16 an unverified task keeps a histogram share and answers the largest query at once)
GRID20 = {"kind": "uniform", "lo": 0.0, "hi": 1.0, "bits": 20}
BIG = json.dumps({"kind": "prefix", "indices": list(range(1 << 16))}).encode()  # the largest query allowed
SMALL = json.dumps({"kind": "prefix", "indices": [40000]}).encode()


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """Two servers allowing one close or query in flight per analyst token (DPCDF_ANALYST_CONCURRENCY=1),
    and two closed tasks: A with enough reports that its largest query takes a while, B small."""
    base = tmp_path_factory.mktemp("stalls")
    procs = []
    try:
        for party in (0, 1):
            log = open(base / f"s{party}.log", "wb")
            procs.append(start_server(party, str(base / f"s{party}"), log=log,
                                      extra_env={"DPCDF_ANALYST_CONCURRENCY": "1"}))
        urls = [u for _, u in procs]
        deadline = time.monotonic() + 300
        while not all(http("GET", f"{u}/health")["warm"] for u in urls):
            assert time.monotonic() < deadline, "the servers' kernels did not compile"
            time.sleep(0.2)
        rng = np.random.default_rng(11)
        tasks = {}
        for name, n in (("A", 10_000), ("B", 100)):
            # unverified: their queries evaluate every key (a verified task answers from its histogram in ms)
            config, token = create_task(urls, GRID17, 1.0, "tree", "substitution", min_batch=1, verify=False)
            assert submit(config, rng.uniform(0, 1, n), batch=2000)["complete"] == n
            Analyst(config, token).close()
            http("POST", f"{urls[0]}/tasks/{config.task_id}/query", SMALL, token)  # key shares loaded
            tasks[name] = (config, token)
        yield urls, tasks
    finally:
        for proc, _ in procs:
            stop(proc)


def _post(url: str, body: bytes, token: str):
    """(status, headers, JSON body) of a POST, whatever the status."""
    req = urllib.request.Request(url, data=body, method="POST",
                                 headers={"Content-Type": "application/json", "Authorization": f"Bearer {token}"})
    try:
        with urllib.request.urlopen(req, timeout=600) as resp:
            return resp.status, resp.headers, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers, json.loads(exc.read())


def _in_background(fn):
    """Runs fn in a thread; returns the thread and the list its (start, end) times are appended to."""
    spans, errors = [], []

    def run() -> None:
        try:
            t0 = time.monotonic()
            fn()
            spans.append((t0, time.monotonic()))
        except Exception as exc:  # surfaced by the test after join
            errors.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    return thread, spans, errors


def test_a_big_query_on_one_task_does_not_block_another_tasks_queries(pair):
    """While A's largest query runs on server 0, B's small queries (another analyst) are answered:
    some B query starts well after A's started and finishes before A's ends. Under one server-wide
    answer lock no B query could (it would wait for A's to finish)."""
    urls, tasks = pair
    (a, a_token), (b, b_token) = tasks["A"], tasks["B"]
    overlaps = []
    for _ in range(3):  # three chances: one is enough
        thread, spans, errors = _in_background(lambda: http("POST", f"{urls[0]}/tasks/{a.task_id}/query", BIG, a_token))
        b_spans = []
        while thread.is_alive():
            t0 = time.monotonic()
            answer = http("POST", f"{urls[0]}/tasks/{b.task_id}/query", SMALL, b_token)
            b_spans.append((t0, time.monotonic()))
            assert len(answer["shares"]) == 1
            time.sleep(0.02)
        thread.join()
        assert not errors, errors
        (a0, a1), = spans
        overlaps += [s for s in b_spans if s[0] > a0 + 0.3 and s[1] < a1]
        if overlaps:
            break
    assert overlaps, f"no query of task B was answered while A's largest query ran ({a1 - a0:.2f} s; B's: {b_spans})"


def test_one_analyst_beyond_the_limit_gets_429_with_retry_after(pair):
    """The servers here allow one close or query in flight per analyst token: a second one while A's
    largest query runs is refused at once with 429, {"error": ...} and Retry-After; another analyst is
    not limited by it; once A's query is done the same request is answered."""
    urls, tasks = pair
    (a, a_token), (b, b_token) = tasks["A"], tasks["B"]
    query_a = f"{urls[0]}/tasks/{a.task_id}/query"
    for _ in range(3):  # A's query must still be running when the second one arrives: three chances
        thread, spans, errors = _in_background(lambda: http("POST", query_a, BIG, a_token))
        time.sleep(0.3)
        status, headers, body = _post(query_a, SMALL, a_token)
        refused_at = time.monotonic()
        other = _post(f"{urls[0]}/tasks/{b.task_id}/query", SMALL, b_token)[0]
        thread.join()
        assert not errors, errors
        if refused_at < spans[0][1]:
            break
    assert refused_at < spans[0][1], f"A's largest query ended before the second request was answered ({status})"
    assert status == 429, (status, body)
    assert set(body) == {"error"} and "at once" in body["error"]
    assert int(headers["Retry-After"]) >= 1
    assert other == 200  # another analyst's token has its own allowance
    status, _, body = _post(query_a, SMALL, a_token)
    assert status == 200 and len(body["shares"]) == 1
    # the close counts too (server 0 does the work): it is answered when nothing else is in flight
    assert _post(f"{urls[0]}/tasks/{a.task_id}/close", b"", a_token)[0] == 200


def test_registering_and_using_a_2_20_tree_task_is_quick(pair):
    """The tree plan of a 2^20 grid is computed in closed form and cached: registering such a task and
    its first use (the server builds its state) take well under the seconds they took (about 2.3 s of
    planning per config parse, three parses)."""
    urls, _ = pair
    keys = [http("GET", f"{u}/hpke")["keys"]["x25519"] for u in urls]
    config = TaskConfig(GRID20, 1.0, "tree", "substitution", 1, (urls[0], urls[1]), (keys[0], keys[1]),
                        token_hash("analyst"), task_id="tree-2-20")
    t = time.monotonic()
    http("POST", f"{urls[0]}/tasks", config.to_json().encode(), OPERATOR)
    status = http("GET", f"{urls[0]}/tasks/{config.task_id}", token="analyst")
    took = time.monotonic() - t
    assert status["reports"] == 0 and not status["closed"]
    assert took < 2.0, f"registering and loading a 2^20 tree task took {took:.2f} s"


def test_the_plan_cache_returns_the_same_mechanism():
    size, eps = (1 << 20) - 3, 0.7
    before = tree_plan.cache_info()
    m1 = TreeMechanism(size, eps, "add-remove")
    m2 = TreeMechanism(size, eps, "add-remove")
    after = tree_plan.cache_info()
    assert after.hits >= before.hits + 1 and after.misses <= before.misses + 1
    assert (m1.branching, m1.budgets, m1.scales) == (m2.branching, m2.budgets, m2.scales)
    assert tree_plan(size, eps, "add-remove") is tree_plan(size, eps, "add-remove")
    # a given branching factor is planned (and cached) on its own key
    m3 = TreeMechanism(size, eps, "add-remove", branching=4)
    assert m3.branching == 4 and m3.budgets == tree_plan(size, eps, "add-remove", 4)[1] != m1.budgets
    misses = tree_plan.cache_info().misses
    TreeMechanism(size, eps, "substitution")
    TreeMechanism(size, eps / 2, "add-remove")
    assert tree_plan.cache_info().misses == misses + 2  # the relation and epsilon are in the key


@pytest.mark.parametrize("size", [1, 2, 5, 16, 17, 63, 64, 65, 100, 729, 1000, 4095, 4096, 65536, 99_991])
def test_closed_form_covering_counts_match_the_tree(size):
    for b in (2, 3, 4, 7, 10, 16, 17, 64, max(size, 2)):
        shape = TreeShape.for_size(size, b)
        np.testing.assert_array_equal(_covering_counts(size, b, shape.height), shape.covering_counts())


def test_a_slow_task_build_does_not_block_other_tasks(tmp_path, monkeypatch):
    """In process, deterministic: while task X's state is being built (held on an event), task Y's is
    built and returned, and a second request for X waits for X's one build instead of making another."""
    monkeypatch.setenv("DPCDF_ADMIN_TOKEN", "x" * 20)
    servers = [Server(p, tmp_path / f"s{p}", noise=False) for p in (0, 1)]
    srv = servers[0]
    hexkeys = (servers[0].keys.public_hex("x25519"), servers[1].keys.public_hex("x25519"))
    for task_id in ("X", "Y"):
        config = TaskConfig({"kind": "uniform", "lo": 0, "hi": 1, "bits": 8}, 1.0, "tree", "substitution", 1,
                            ("http://a", "http://b"), hexkeys, token_hash("t"), task_id=task_id)
        srv.store.add_task(task_id, config.to_json(), config.fingerprint, b"\0" * 32)
    gate, entered, builds = threading.Event(), threading.Event(), []
    real = state_module.TaskState

    def slow_state(config, *args):
        builds.append(config.task_id)
        if config.task_id == "X":
            entered.set()
            assert gate.wait(60)
        return real(config, *args)

    monkeypatch.setattr(state_module, "TaskState", slow_state)
    got = {}
    first = threading.Thread(target=lambda: got.setdefault("x1", srv.task("X")))
    second = threading.Thread(target=lambda: got.setdefault("x2", srv.task("X")))
    first.start()
    assert entered.wait(30)
    second.start()
    y = srv.task("Y")  # not held up by X's build
    assert y.config.task_id == "Y" and "x1" not in got and "x2" not in got
    gate.set()
    first.join(30)
    second.join(30)
    assert got["x1"] is got["x2"] is srv.task("X")
    assert builds == ["X", "Y"]  # X built once
    with pytest.raises(TaskNotFound) as info:
        srv.task("nope")
    assert status_of(info.value) == 404
    assert srv._building == {}  # no per-id locks left behind


def test_the_limiter_counts_per_key_and_releases():
    limiter = state_module.Limiter(2, "test requests")
    with limiter.slot("k"), limiter.slot("k"):
        with pytest.raises(Throttled) as info:
            with limiter.slot("k"):
                pass
        assert info.value.status == 429 and info.value.headers["Retry-After"]
        with limiter.slot("other"):
            pass
    with limiter.slot("k"), limiter.slot("k"):
        pass
    assert limiter._busy == {}
    assert isinstance(info.value, DpcdfError)
    with pytest.raises(DpcdfError):  # a limit below 1
        state_module.Limiter(0, "none")
