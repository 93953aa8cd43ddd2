"""Adversarial review of adaptive tasks on the two servers (commit eafed2e): an untrusted analyst (any
body, any order, replays, concurrent queries, different designs to the two servers, server restarts),
one server that may lie to the analyst, and the claims (a) at most epsilon whatever the analyst does,
(b) a malformed query gets a 4xx with a message, never a 500 or a hang, (c) the analyst's release is the
central one with both servers' noise. Real server processes on loopback, real HPKE, real SQLite.

A test marked `# review finding (fixed):` asserts the correct behaviour; it failed on the code as reviewed
and passes since the fixes that followed the review."""
from __future__ import annotations

import json
import threading

import numpy as np
import pytest

from dpcdf.errors import DpcdfError
from dpcdf.release.adaptive import ROUND_ONE_BINS
from dpcdf.release.ecdf import finish_release, prefix_counts
from dpcdf.release.mechanisms import node_counts
from dpcdf.service.client import analyst as analyst_module
from dpcdf.service.client.analyst import Analyst
from dpcdf.service.client import create_task, submit
from dpcdf.service.http import ServerError, fetch
from dpcdf.service.processes import free_port, start_server, stop
from helpers import TESTING, urls
from test_adaptive_tasks import GRID8, _both_noises, _skewed, _uniform

QUERY = "/tasks/{}/query"


def _post(url: str, task_id: str, body, token: str) -> tuple[int, dict]:
    """One query to one server: (status, JSON answer); the body as given (bytes, or JSON-encoded)."""
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    try:
        return 200, json.loads(fetch("POST", url + QUERY.format(task_id), raw, token, timeout=60))
    except ServerError as exc:
        return exc.status, {"error": str(exc)}


def _spiky(n: int, seed: int) -> np.ndarray:
    """Five narrow spikes: on 2^8 points with 3000 reports round one plans the tree (the simulated data only)."""
    rng = np.random.default_rng(seed)
    return np.clip(rng.normal(np.array([7.0, 7.5, 44.0, 63.0, 95.0])[rng.integers(0, 5, n)], 0.1), 0, 100)


@pytest.fixture(scope="module")
def task(servers):
    """One closed substitution adaptive task on the exact pair, for the malformed-query tests."""
    procs, _ = servers
    config, token = create_task(urls(procs["exact"]), GRID8, 1.0, "adaptive", "substitution", min_batch=0)
    submit(config, _uniform(60, 11))
    Analyst(config, token).close()
    return config, token


# --- (b) malformed queries: 4xx with a message, never a 500 -------------------------------------------
@pytest.mark.parametrize("ends", [[2 ** 64], [2 ** 63, 255], [0, 2 ** 100], [-(2 ** 70), 255], [255, 2 ** 63]])
def test_round_two_ends_beyond_int64_are_refused_400_not_500(task, servers, ends):
    """Review finding (fixed): StrictInt takes any JSON integer; `check_plan` converts the ends with np.asarray(int64),
    which raises OverflowError (not ParameterError), so the router's check lets it through as a 500."""
    procs, _ = servers
    config, token = task
    status, answer = _post(urls(procs["exact"])[0], config.task_id, {"kind": "bins", "round": 2, "ends": ends}, token)
    assert status == 400, answer


@pytest.mark.parametrize("round_", [True, 1.0])
def test_round_is_an_integer_like_every_other_query_field(task, servers, round_):
    """BUG (low, no privacy cost): `round` is Literal[1, 2] in lax mode, so true and 1.0 are round 1
    (and 2.0 round 2, which then fixes round two), while `level`, `indices`, `edges` and `ends` are
    StrictInt (true and 1.0 refused there)."""
    procs, _ = servers
    config, token = task
    body = {"kind": "bins", "round": round_}
    status, answer = _post(urls(procs["exact"])[1], config.task_id, body, token)
    assert status == 400, answer


MALFORMED = [
    {"kind": "bins", "round": 2, "ends": list(range(1 << 16))},  # the largest list, not a partition of 256 points
    {"kind": "bins", "round": 2, "ends": list(range((1 << 16) + 1))},  # over MAX_QUERY_POINTS
    {"kind": "bins", "round": 2, "ends": [3, 3, 255]}, {"kind": "bins", "round": 2, "ends": [3, 256]},
    {"kind": "bins", "round": 2, "ends": [3, 255, 255]}, {"kind": "bins", "round": 2, "ends": [255, 255]},
    {"kind": "bins", "round": 2, "ends": [True, 255]}, {"kind": "bins", "round": 2, "ends": [3.0, 255]},
    {"kind": "bins", "round": 2, "ends": ["3", 255]}, {"kind": "bins", "round": 2, "ends": [None, 255]},
    {"kind": "bins", "round": 2, "ends": [[3], 255]}, {"kind": "bins", "round": 2, "ends": {"0": 255}},
    {"kind": "bins", "round": 2, "ends": "255"}, {"kind": "bins", "round": 2, "ends": []},
    {"kind": "bins", "round": 1, "ends": []}, {"kind": "bins", "round": 1, "ends": [255]},
    {"kind": "bins", "round": 0}, {"kind": "bins", "round": "1"}, {"kind": "bins", "round": None},
    {"kind": "bins"}, {"kind": "bins", "round": 2, "ends": [-(2 ** 63), 255]},
    {"kind": "nodes", "level": True}, {"kind": "nodes", "level": -1}, {"kind": "nodes", "level": 2 ** 70},
    {"kind": "groups", "edges": [3]}, {"kind": "prefix", "indices": [255]}, {"kind": "coordinates"},
    [], "bins", 1, None,
]


def test_malformed_bins_and_node_bodies_get_400_and_fix_nothing(task, servers):
    """Every malformed query: 400 with a message (no 422, no 500), on both servers; none of them fixes
    round two, so a valid design is still answered after all of them, and then only that one."""
    procs, _ = servers
    config, token = task
    for url in urls(procs["exact"]):
        for body in MALFORMED:
            status, answer = _post(url, config.task_id, body, token)
            assert status == 400 and answer["error"], (str(body)[:80], status, answer)
        for raw in (b"{", b"", b'{"kind": "bins", "round": 1' + b"]" * 10, b"[" * 100000):
            status, answer = _post(url, config.task_id, raw, token)
            assert status == 400, (raw[:20], status, answer)
    a = Analyst(config, token)
    assert a._ask({"kind": "bins", "round": 2, "ends": [100, 255]})[0].size == 2
    with pytest.raises(ServerError, match="403"):
        a._ask({"kind": "bins", "round": 2, "ends": [101, 255]})


# --- (a) one round-two design per server per task -------------------------------------------------------
@pytest.fixture(scope="module")
def own_pair(tmp_path_factory):
    """Two noisy servers on fixed ports (server 0 can be restarted at the same URL), with a per-analyst
    limit high enough that concurrent queries all reach the task's lock."""
    base = tmp_path_factory.mktemp("own")
    env = {**TESTING, "DPCDF_ANALYST_CONCURRENCY": "32"}
    ports, procs, logs = [free_port(), free_port()], [], []

    def start(party):
        logs.append(open(base / f"s{party}.{len(logs)}.log", "wb"))
        return start_server(party, str(base / f"s{party}"), port=ports[party], log=logs[-1], extra_env=env)[0]

    procs.extend([start(0), start(1)])
    state = {"procs": procs, "start": start, "base": base, "urls": [f"http://127.0.0.1:{p}" for p in ports]}
    yield state
    for p in state["procs"]:
        stop(p)
    for f in logs:
        f.close()


def test_concurrent_different_round_two_designs_to_one_server_get_one_answer(own_pair):
    """12 threads send 12 different round-two designs (11 bin partitions and a node query) to server 0 at
    once: exactly one design is answered (the first to reach the task's lock), every other is 403 and
    none is a 5xx; the same holds independently on server 1 afterwards, and the fixed design is then
    answered again identically (replay: nothing spent twice)."""
    u = own_pair["urls"]
    config, token = create_task(u, GRID8, 1.0, "adaptive", "substitution", min_batch=0)
    submit(config, _skewed(150, 21))
    Analyst(config, token).close()
    designs = [{"kind": "bins", "round": 2, "ends": [10 * k + 5, 255]} for k in range(11)] + [{"kind": "nodes", "level": 0}]
    for url in u:
        results: list = [None] * len(designs)
        barrier = threading.Barrier(len(designs))

        def go(i):
            barrier.wait()
            results[i] = _post(url, config.task_id, designs[i], token)

        threads = [threading.Thread(target=go, args=(i,)) for i in range(len(designs))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        statuses = [r[0] for r in results]
        assert statuses.count(200) == 1 and statuses.count(403) == len(designs) - 1, statuses
        winner = statuses.index(200)
        again = _post(url, config.task_id, designs[winner], token)
        assert again == (200, results[winner][1])
        for i, d in enumerate(designs):
            if i != winner:
                assert _post(url, config.task_id, d, token)[0] == 403


def test_different_designs_on_the_two_servers_each_stay_fixed_and_the_release_is_refused(own_pair):
    """An analyst sending ends A to server 0 and ends B to server 1 gets one round-two answer from each
    (each within that server's eps_2: every noise it adds is its own), can get neither server's answer to
    the other design nor its tree, and the honest release is then refused (403) rather than mixed."""
    u = own_pair["urls"]
    config, token = create_task(u, GRID8, 1.0, "adaptive", "substitution", min_batch=0)
    submit(config, _skewed(150, 22))
    Analyst(config, token).close()
    a, b = {"kind": "bins", "round": 2, "ends": [40, 255]}, {"kind": "bins", "round": 2, "ends": [41, 255]}
    assert _post(u[0], config.task_id, a, token)[0] == 200 and _post(u[1], config.task_id, b, token)[0] == 200
    assert _post(u[0], config.task_id, b, token)[0] == 403 and _post(u[1], config.task_id, a, token)[0] == 403
    for url in u:
        assert _post(url, config.task_id, {"kind": "nodes", "level": 0}, token)[0] == 403
        assert _post(url, config.task_id, {"kind": "bins", "round": 1}, token)[0] == 200  # round one: fixed noise
    with pytest.raises(ServerError, match="403"):
        Analyst(config, token).release()


def test_a_restarted_server_keeps_its_round_two_design_and_noise(own_pair):
    """fix_release is in SQLite: after server 0 restarts on the same data directory, the other design and
    the tree are still refused, and the fixed design and round one are answered with the same shares (the
    noise seed is the stored one)."""
    u = own_pair["urls"]
    config, token = create_task(u, GRID8, 1.0, "adaptive", "substitution", min_batch=0)
    submit(config, _skewed(150, 23))
    Analyst(config, token).close()
    fixed, other = {"kind": "bins", "round": 2, "ends": [7, 99, 255]}, {"kind": "bins", "round": 2, "ends": [255]}
    before = [_post(u[0], config.task_id, q, token) for q in (fixed, {"kind": "bins", "round": 1})]
    assert [s for s, _ in before] == [200, 200]
    stop(own_pair["procs"][0])
    own_pair["procs"][0] = own_pair["start"](0)
    after = [_post(u[0], config.task_id, q, token) for q in (fixed, {"kind": "bins", "round": 1})]
    assert after == before
    assert _post(u[0], config.task_id, other, token)[0] == 403
    assert _post(u[0], config.task_id, {"kind": "nodes", "level": 1}, token)[0] == 403


# --- (c) the release is the central one with both servers' noise -----------------------------------------
def test_tree_design_under_add_remove_verified_equals_central_with_every_level(servers):
    """Spiky data plans round two's tree; under add/remove on a verified task (shares in F_p, the noise
    added as negative field elements where it is negative): round one has negative bins and equals the
    central one, every released level's nodes (the noised root included) equal the central node counts
    plus both servers' noise, and the release equals the central release value for value."""
    procs, _ = servers
    pair = procs["noisy"]
    config, token = create_task(urls(pair), GRID8, 1.0, "adaptive", "add-remove", min_batch=0)
    assert config.verify
    vals = _spiky(3000, 5)
    submit(config, vals, batch=1000)
    a = Analyst(config, token)
    mech, grid = config.make_mechanism(), config.make_grid()
    prefix, noise = prefix_counts(vals, grid), _both_noises(pair, config)
    one, n = a._ask({"kind": "bins", "round": 1})
    assert n == 0 and one.size == ROUND_ONE_BINS and one.min() < 0
    np.testing.assert_array_equal(one, np.diff(np.append(0, prefix[mech.round_one_ends])) + mech.bin_noise(1, 32, noise))
    levels = mech.released_levels()
    assert mech.tree.shape.height in levels  # the root is released, noised, under add/remove
    for level in levels:
        got, _ = a._ask({"kind": "nodes", "level": level})
        want = node_counts(prefix, mech.tree.shape, level) + mech.tree.node_noise(level, np.arange(got.size), noise)
        np.testing.assert_array_equal(got, want)
    root, _ = a._ask({"kind": "nodes", "level": mech.tree.shape.height})
    assert root[0] != 3000  # noised

    central = mech.noisy(prefix, noise, copies=2)  # n (the last prefix) is not used under add/remove
    assert central.plan.design == "tree"
    want = finish_release(grid, mech, central, 0, copies=2)
    rel = a.release()
    np.testing.assert_allclose(rel.counts, want.counts, atol=1e-6)
    assert rel.total == pytest.approx(want.total)


def test_substitution_node_levels_equal_central_and_the_root_is_n(servers):
    """Under substitution every released level equals the central node counts plus both noises, and the
    root level (public n) is n exactly, without noise."""
    procs, _ = servers
    pair = procs["noisy"]
    config, token = create_task(urls(pair), GRID8, 1.0, "adaptive", "substitution", min_batch=0, verify=False)
    vals = _skewed(300, 9)
    submit(config, vals)
    a = Analyst(config, token)
    mech, grid = config.make_mechanism(), config.make_grid()
    prefix, noise = prefix_counts(vals, grid), _both_noises(pair, config)
    for level in mech.released_levels():
        got, n = a._ask({"kind": "nodes", "level": level})
        want = node_counts(prefix, mech.tree.shape, level) + mech.tree.node_noise(level, np.arange(got.size), noise)
        np.testing.assert_array_equal(got, want)
    root, n = a._ask({"kind": "nodes", "level": mech.tree.shape.height})
    assert n == 300 and root.tolist() == [300]


# --- an analyst facing one lying server -----------------------------------------------------------------
def _tampering(monkeypatch, change):
    """The analyst's http, with `change(url, question, answer)` applied to every query answer."""
    real = analyst_module.http

    def http(method, url, body=None, token=None, **kw):
        answer = real(method, url, body, token, **kw)
        if url.endswith("/query"):
            change(url, json.loads(body), answer)
        return answer

    monkeypatch.setattr(analyst_module, "http", http)


def test_a_server_answering_round_two_with_extra_shares_gives_a_typed_error(servers, monkeypatch):
    """Review finding (fixed): server 1 answers round two with one share more than asked: the analyst fails with numpy's
    bare ValueError (broadcasting in the reconstruction, or np.interp in the post-processing when the
    plan has one bin), not a DpcdfError (`gather` checks round one's length but not round two's)."""
    procs, _ = servers
    pair = procs["exact"]
    config, token = create_task(urls(pair), GRID8, 1.0, "adaptive", "substitution", min_batch=0)
    submit(config, _uniform(80, 13))
    server1 = urls(pair)[1]

    def extra(url, question, answer):
        if url.startswith(server1) and question.get("round") == 2:
            answer["shares"] = answer["shares"] + ["0"]

    _tampering(monkeypatch, extra)
    with pytest.raises(DpcdfError):
        Analyst(config, token).release()


@pytest.mark.parametrize("n", [float("nan"), "many", [1]])
def test_a_server_sending_a_bad_n_gives_a_typed_error(servers, monkeypatch, n):
    """Review finding (fixed): server 0's n (which plans round two under substitution) as NaN, a string or a list: the
    analyst fails with a bare ValueError/TypeError from int(n), not a DpcdfError."""
    procs, _ = servers
    pair = procs["exact"]
    config, token = create_task(urls(pair), GRID8, 1.0, "adaptive", "substitution", min_batch=0)
    submit(config, _uniform(40, 14))
    server0 = urls(pair)[0]

    def bad_n(url, question, answer):
        if url.startswith(server0):
            answer["n"] = n

    _tampering(monkeypatch, bad_n)
    with pytest.raises(DpcdfError):
        Analyst(config, token).release()


def test_huge_but_well_formed_answers_do_not_crash_the_plan(servers, monkeypatch):
    """A lying server 1 that shifts every share by 2^62 (counts of +-4.6e18 after reconstruction): the
    analyst still plans and returns a finite release within [0, n] (garbage, but no crash or hang)."""
    procs, _ = servers
    pair = procs["exact"]
    config, token = create_task(urls(pair), GRID8, 1.0, "adaptive", "substitution", min_batch=0)
    submit(config, _uniform(40, 15))
    server1 = urls(pair)[1]

    def shift(url, question, answer):
        if url.startswith(server1):
            answer["shares"] = [str((int(v) + (1 << 62) * (1 if i % 3 else -1)) % (1 << 64)) if int(answer["modulus"]) == 1 << 64
                                else str((int(v) + (1 << 59) * (1 if i % 3 else -1)) % int(answer["modulus"]))
                                for i, v in enumerate(answer["shares"])]

    _tampering(monkeypatch, shift)
    rel = Analyst(config, token).release()
    assert np.all(np.isfinite(rel.counts)) and rel.counts.min() >= 0 and rel.counts.max() <= 40
