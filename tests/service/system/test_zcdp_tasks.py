"""rho-zCDP tasks over the two servers (issue 14): the square-root factorization and the Gaussian
tree, each server adding its own exact discrete Gaussian from its PRF. Real server processes on
loopback, real HPKE, real SQLite; the CLI as a user runs it. Then the findings of their independent
review on the servers (below)."""
from __future__ import annotations

import json
import math
import secrets
import sqlite3
import subprocess
import sys
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest

from fss import field as F
from dpcdf import DpcdfError, ParameterError
from dpcdf.analyst import Analyst
from dpcdf.release.ecdf import prefix_counts
from dpcdf.release.factorization import right_factor, right_factor_times, sqrt_factorization
from dpcdf.release.zcdp import PrfStream, dgauss_pmf, dgauss_variance, prf_dgauss
from dpcdf.service.server.aggregate import Aggregator
from dpcdf.service.client import create_task, submit
from dpcdf.service.client.analyst import Analyst as ClientAnalyst  # the review's analyst: the service's, without the apps
from dpcdf.service.http import ServerError, http
from dpcdf.service.task import TaskConfig
from dpcdf.service.wire import encode_batch
from helpers import dpcdf_cli, GRID, OPERATOR, urls, values
from test_malicious_clients import forged, honest_extras, seal
from test_zcdp_tasks_accounting import _cfg, _status


def _seed(data_dir: Path, task_id: str) -> bytes:
    db = sqlite3.connect(str(data_dir / "server.sqlite"))
    (seed,) = db.execute("SELECT noise_seed FROM tasks WHERE task_id = ?", (task_id,)).fetchone()
    db.close()
    return bytes(seed)


def _zcdp(pair, mechanism: str, relation: str = "substitution", verify: bool | None = None):
    return create_task(urls(pair), GRID, None, mechanism, relation, min_batch=0, verify=verify, rho=0.5)


@pytest.mark.parametrize("mechanism, relation, verify", [
    ("factorization", "substitution", None), ("factorization", "add-remove", False), ("tree", "substitution", None),
    ("tree", "add-remove", False)])
def test_without_noise_the_release_is_the_exact_ecdf(servers, mechanism, relation, verify):
    procs, _ = servers
    config, token = _zcdp(procs["exact"], mechanism, relation, verify)
    assert config.verify == (verify is None)  # verified by default: the shares are in F_p, R x mod p
    vals = values(140, 11)
    assert submit(config, vals, batch=50)["complete"] == 140
    rel = Analyst(config, token).release("monotone")  # noise off: the plain fit (the default smooths a tree)
    truth = prefix_counts(vals, config.make_grid())
    np.testing.assert_allclose(rel.counts, truth, atol=1e-6)
    assert "zCDP under " + relation in rel.statement


@pytest.mark.parametrize("verify", [None, False])
def test_with_noise_the_coordinates_are_r_x_plus_both_servers_discrete_gaussians(servers, verify):
    """White box: what the analyst adds up is R x (exact) plus the noise each server's seed derives
    for coordinates 0..N-1, then n; asked again, the same (no fresh noise: no budget spent twice)."""
    procs, _ = servers
    pair = procs["noisy"]
    config, token = _zcdp(pair, "factorization", verify=verify)
    vals = values(90, 12)
    submit(config, vals)
    analyst = Analyst(config, token)
    y, n = analyst._ask({"kind": "coordinates"})
    truth = prefix_counts(vals, config.make_grid())
    x = np.diff(truth, prepend=0).astype(np.uint64)
    rx = right_factor_times(x, 1 << 64).view(np.int64)
    noise = np.zeros(truth.size, np.int64)
    for data_dir in (d for _, _, d in pair):
        agg = Aggregator(config.dcf(), config.make_mechanism(), _seed(data_dir, config.task_id), config.task_id)
        alone = agg.coordinate_shares([])  # no keys: the noise alone, and a zero share of n
        noise += (F.signed(alone) if agg.prime else alone.view(np.int64))[:-1]
    np.testing.assert_array_equal(y[:-1], rx + noise)
    assert y[-1] == n == 90 and np.all(noise != 0)
    again, _ = analyst._ask({"kind": "coordinates"})
    np.testing.assert_array_equal(again, y)
    rel = analyst.release()
    assert np.all(np.diff(rel.counts) >= 0) and rel.counts[-1] == pytest.approx(90)


def test_queries_outside_the_mechanism_are_refused(servers):
    """A factorization task answers its coordinates only (a prefix or node answer would carry no
    noise of its own kind, or other noise: either spends budget the task did not plan); a tree or
    path task has no coordinates."""
    procs, _ = servers
    config, token = _zcdp(procs["noisy"], "factorization")
    submit(config, values(30, 13))
    analyst = Analyst(config, token)
    for question in ({"kind": "prefix", "indices": [3]}, {"kind": "nodes", "level": 0}):
        with pytest.raises(ServerError, match="400.*coordinates"):
            analyst._ask(question)
    with pytest.raises(DpcdfError, match="release"):
        analyst.prefix_counts([3])
    tree, tree_token = _zcdp(procs["noisy"], "tree")
    submit(tree, values(30, 14))
    with pytest.raises(ServerError, match="400.*coordinates"):
        Analyst(tree, tree_token)._ask({"kind": "coordinates"})
    counts, _ = Analyst(tree, tree_token).prefix_counts([10, 63])  # the zCDP tree answers prefixes
    assert counts.size == 2


@pytest.mark.parametrize("change, match", [
    ({"epsilon": 1.0}, "rho, not epsilon"), ({"rho": None}, "rho"), ({"mechanism": "path"}, "'factorization' or 'tree'"),
    ({"payload": "label"}, "payload 'count'"), ({"privacy": "renyi"}, "privacy"),
    ({"grid": {"kind": "uniform", "lo": 0, "hi": 1, "bits": 14}}, "2 to 8192"),
    ({"privacy": "pure", "epsilon": 1.0}, "rho is for")])
def test_bad_zcdp_configs_are_refused(change, match):
    base = dict(grid=GRID, epsilon=None, mechanism="factorization", relation="substitution", min_batch=0,
                servers=("http://a", "http://b"), hpke_keys=("00", "01"), token_hash="0" * 64, privacy="zcdp", rho=0.5)
    with pytest.raises(ParameterError, match=match):
        TaskConfig(**(base | change))


def test_a_pure_task_keeps_its_json_and_fingerprint():
    """Configs written before zCDP tasks existed: no privacy or rho field, the same fingerprint."""
    pure = TaskConfig(GRID, 1.0, "tree", "substitution", 0, ("http://a", "http://b"), ("00", "01"), "0" * 64,
                      verify=False, task_id="t1")
    assert "privacy" not in pure.to_json() and "rho" not in pure.to_json()
    assert TaskConfig.from_json(pure.to_json()).fingerprint == pure.fingerprint
    zcdp = TaskConfig(GRID, None, "factorization", "substitution", 0, ("http://a", "http://b"), ("00", "01"), "0" * 64,
                      privacy="zcdp", rho=0.5, task_id="t1")
    again = TaskConfig.from_json(zcdp.to_json())
    assert again == zcdp and again.make_mechanism().sigma2 == sqrt_factorization(64, 0.5).sigma2


def test_a_servers_coordinate_noise_is_the_discrete_gaussian():
    """Each server's noise alone (its PRF, 40 random seeds x 64 coordinates = 2,560 draws, scaled by
    sigma): variance within 5 standard errors of Var(N_Z(0, sigma^2)), mean 0; two servers' noises
    are independent (correlation within 5 / sqrt(draws))."""
    config = TaskConfig(GRID, None, "factorization", "add-remove", 0, ("http://a", "http://b"), ("00", "01"), "0" * 64,
                        privacy="zcdp", rho=0.5, verify=False)
    mech = config.make_mechanism()
    draws = [[], []]
    for _ in range(40):
        for party in (0, 1):
            agg = Aggregator(config.dcf(), mech, secrets.token_bytes(32), config.task_id)
            draws[party].append(agg.coordinate_shares([]).view(np.int64))
    z0, z1 = (np.concatenate(d) / math.sqrt(float(mech.sigma2)) for d in draws)
    var = dgauss_variance(float(mech.sigma2)) / float(mech.sigma2)
    for z in (z0, z1):
        assert abs(z.var() - var) < 5 * var * math.sqrt(2 / z.size)
        assert abs(z.mean()) < 5 * math.sqrt(var / z.size)
    assert abs(np.corrcoef(z0, z1)[0, 1]) < 5 / math.sqrt(z0.size)


def test_prf_dgauss_is_exact_on_a_small_sigma_and_deterministic():
    """At sigma^2 = 9/2, 20,000 PRF draws match the exact probabilities of 0, +-1, +-3; the same key
    and id give the same sample, and PrfStream.randbelow is uniform over a range above 2^64."""
    key = secrets.token_bytes(16)
    ids = np.arange(20_000, dtype=np.uint64)
    draws = prf_dgauss(key, ids, Fraction(9, 2))
    for y in (0, 1, -1, 3, -3):
        p = dgauss_pmf(4.5, [y])[0]
        assert abs(np.mean(draws == y) - p) < 5 * math.sqrt(p * (1 - p) / draws.size)
    np.testing.assert_array_equal(prf_dgauss(key, ids[:50], Fraction(9, 2)), draws[:50])
    assert not np.array_equal(prf_dgauss(secrets.token_bytes(16), ids[:50], Fraction(9, 2)), draws[:50])
    from Crypto.Cipher import AES

    stream = PrfStream(AES.new(key, AES.MODE_ECB), 7)
    m = 3 << 64  # three equal thirds: each should get a third of the draws
    thirds = np.bincount([stream.randbelow(m) >> 64 for _ in range(6000)], minlength=3)
    assert thirds.size == 3 and np.all(np.abs(thirds - 2000) < 5 * math.sqrt(6000 * (1 / 3) * (2 / 3)))


def test_the_cli_makes_and_answers_a_zcdp_task(servers, tmp_path):
    """The user's path: `dpcdf task --rho`, `dpcdf submit`, `dpcdf query` on real processes."""
    procs, _ = servers
    dpcdf = dpcdf_cli
    task = tmp_path / "task.json"
    made = dpcdf("task", "--servers", *urls(procs["exact"]), "--grid", "uniform:0:100:6", "--rho", "0.5",
                 "--min-batch", "0", "--out", str(task))
    assert made.returncode == 0, made.stderr
    config = TaskConfig.from_json(task.read_text())
    assert (config.privacy, config.mechanism, config.epsilon) == ("zcdp", "factorization", None)
    vals = values(80, 15)
    sent = dpcdf("submit", "--task", str(task), "--values", *[repr(float(v)) for v in vals])
    assert sent.returncode == 0, sent.stderr
    asked = dpcdf("query", "--task", str(task), "--quantiles", "0.5")
    assert asked.returncode == 0, asked.stderr
    assert "zCDP under substitution" in asked.stdout and "q(0.5) = " in asked.stdout
    bisect = dpcdf("query", "--task", str(task), "--bisect")
    assert bisect.returncode == 2 and "sqrt-factorization mechanism" in bisect.stderr and "without --bisect" in bisect.stderr
    both = dpcdf("task", "--servers", *urls(procs["exact"]), "--grid", "uniform:0:100:6", "--rho", "0.5",
                 "--epsilon", "1", "--out", str(tmp_path / "bad.json"))
    assert both.returncode != 0 and "not allowed with" in both.stderr


# ==================================================================================================
# An independent review of the rho-zCDP tasks, on the servers: what an analyst can get from them
# (kinds, malformed bodies, repeated questions, noiseless values) and forged reports on a verified
# zCDP task, as tests that assert each claim holds. The review's in-process findings (accounting,
# the PRF sampler, R x, configs) are in tests/service/test_zcdp_tasks_accounting.py.
# (moved from tests/service/test_review_zcdp.py)
# ==================================================================================================
P = F.P
RELATIONS = ["substitution", "add-remove"]
OFF_GRID = {"kind": "thresholds", "values": [float(v) for v in range(50)]}  # 50 points, 6-bit keys: 50..63 off it


def _task(pair, mechanism="factorization", relation="substitution", verify=None, grid=GRID, rho=0.5, epsilon=None, payload="count"):
    return create_task(urls(pair), grid, epsilon, mechanism, relation, min_batch=0, verify=verify, rho=rho, payload=payload)


def _post(config: TaskConfig, token: str, server: int, body: bytes) -> dict:
    return http("POST", f"{config.servers[server]}/tasks/{config.task_id}/query", body, token)


@pytest.mark.parametrize("field", ["rho", "epsilon"])
def test_registering_a_task_with_a_huge_integer_budget_is_a_400(servers, field):
    """The operator's POST /tasks with valid JSON whose rho (a zCDP task) or epsilon (a pure task: the
    same check, from before zCDP) is a 400-digit integer: refused (400), not a server error."""
    procs, _ = servers
    url = urls(procs["exact"])[0]
    keys = [http("GET", f"{u}/hpke")["keys"]["x25519"] for u in urls(procs["exact"])]
    change = {} if field == "rho" else {"privacy": "pure", "rho": None, "epsilon": 0.5, "mechanism": "tree"}
    d = json.loads(_cfg(servers=tuple(urls(procs["exact"])), hpke_keys=tuple(keys), verify=False, **change).to_json())
    body = json.dumps(d, separators=(",", ":")).replace(f'"{field}":0.5', f'"{field}":1' + "0" * 400).encode()
    assert f'"{field}":1000'.encode() in body
    assert _status(http, "POST", f"{url}/tasks", body, OPERATOR) == 400


def test_an_analyst_gets_the_planned_release_only(servers):
    """On a factorization task: prefix, nodes, groups refused (400) on each server, before and after
    the close; a malformed question is a 4xx, never a 5xx; 'coordinates' asked again is the same shares
    on each server: no fresh noise (with an unknown member it is refused, 400, since the review of split
    groups: a body is what its fields say or nothing). Other tasks (the zCDP
    tree, pure path, tree, label and calibration) refuse 'coordinates'."""
    procs, _ = servers
    pair = procs["noisy"]
    config, token = _task(pair, verify=False)
    submit(config, values(40, 21))
    for server in (0, 1):
        for q in ({"kind": "prefix", "indices": [0]}, {"kind": "nodes", "level": 0}, {"kind": "groups", "edges": [3]}):
            assert _status(_post, config, token, server, json.dumps(q).encode()) == 400
    assert _status(_post, config, token, 0, b'{"kind": "coordinates"}') == 409  # not closed yet
    analyst = ClientAnalyst(config, token)
    y, n = analyst._ask({"kind": "coordinates"})
    assert y.size == 65 and n == 40 and y[-1] == 40
    first = [_post(config, token, s, b'{"kind": "coordinates"}') for s in (0, 1)]
    for s in (0, 1):
        assert _post(config, token, s, b'{"kind": "coordinates"}')["shares"] == first[s]["shares"]
        assert _status(_post, config, token, s, b'{"kind": "coordinates", "extra": 1}') == 400
        for q in ({"kind": "prefix", "indices": [0]}, {"kind": "nodes", "level": 6}, {"kind": "groups", "edges": []}):
            assert _status(_post, config, token, s, json.dumps(q).encode()) == 400
    malformed = [b'{"kind": ["coordinates"]}', b'{"kind": {"a": 1}}', b'{"kind": null}', b'{"kind": 1}', b'{"kind": true}',
                 b'{"kind": "COORDINATES"}', b'{"kind": "coordinates "}', b'{}', b'[]', b'"coordinates"', b'null', b'7',
                 b'{"kind": "coordinates"', b'\xff\xfe', b'', b'{"kind": "prefix", "indices": "all"}',
                 b'{"kind": "nodes", "level": "0"}', b'[{"kind": "coordinates"}]']
    for body in malformed:
        for s in (0, 1):
            code = _status(_post, config, token, s, body)
            assert 400 <= code < 500, (body, code)
    assert _status(_post, config, "wrong-token", 0, b'{"kind": "coordinates"}') == 401
    again, _ = analyst._ask({"kind": "coordinates"})
    np.testing.assert_array_equal(again, y)
    others = [_task(pair, "tree"), _task(pair, "path", rho=None, epsilon=1.0), _task(pair, "tree", rho=None, epsilon=1.0),
              _task(pair, "tree", "add-remove", rho=None, epsilon=1.0, payload="label"),
              _task(pair, "tree", rho=None, epsilon=1.0, payload="calibration", grid={"kind": "uniform", "lo": 0.0, "hi": 1.0, "bits": 4})]
    for other, other_token in others:
        labels = None if other.payload == "count" else np.arange(12) % 2
        submit(other, values(12, 22) / (100 if other.payload == "calibration" else 1), labels=labels)
        ClientAnalyst(other, other_token).close()
        for s in (0, 1):
            assert _status(_post, other, other_token, s, b'{"kind": "coordinates"}') == 400


@pytest.mark.parametrize("relation", RELATIONS)
def test_the_coordinates_are_r_x_plus_both_servers_noise_and_nothing_noiseless(servers, relation):
    """White box on the noisy servers (unverified: shares mod 2^64): under add/remove no n (not in the
    answer, not as a share, not in the close or the status), m values each R x + z0 + z1, both
    servers' noise from their own seeds (per task: two tasks of one server have different seeds);
    under substitution the same, then n. Each server's shares alone look nothing like R x."""
    procs, _ = servers
    pair = procs["noisy"]
    config, token = _task(pair, relation=relation, verify=False)
    config2, _ = _task(pair, relation=relation, verify=False)
    vals = values(60, 23)
    submit(config, vals)
    analyst = ClientAnalyst(config, token)
    closed = analyst.close()
    answers = [_post(config, token, s, b'{"kind": "coordinates"}') for s in (0, 1)]
    status = [http("GET", f"{u}/tasks/{config.task_id}", None, token) for u in config.servers]
    m = config.make_grid().size
    public = relation == "substitution"
    assert all(len(a["shares"]) == m + public for a in answers)
    assert all((a["n"] == 60) if public else (a["n"] is None) for a in answers)
    assert (closed == 60) if public else (closed is None)
    assert all((st["reports"] == 60) if public else (st["reports"] is None) for st in status)
    y, _ = analyst._ask({"kind": "coordinates"})
    truth = prefix_counts(vals, config.make_grid())
    rx = np.convolve(np.diff(truth, prepend=0), right_factor(m))[:m]
    noise = []
    for s, (_, _, data_dir) in enumerate(pair):
        seed = _seed(data_dir, config.task_id)
        assert seed != _seed(data_dir, config2.task_id) and seed != _seed(pair[1 - s][2], config.task_id)
        agg = Aggregator(config.dcf(), config.make_mechanism(), seed, config.task_id)
        alone = agg.coordinate_shares([]).view(np.int64)
        noise.append(alone[:m])
        own = np.array([int(v) for v in answers[s]["shares"]], np.uint64).view(np.int64)[:m]
        assert np.count_nonzero(np.abs(own - rx) < 10**7) <= 2  # a share is not R x plus small noise
    np.testing.assert_array_equal(y[:m], rx + noise[0] + noise[1])
    assert np.count_nonzero(noise[0]) >= m - 2 and np.count_nonzero(noise[1]) >= m - 2
    assert np.count_nonzero(noise[0] + noise[1]) >= m - 2  # the servers' noises do not cancel
    if public:
        assert y[m] == 60


def _forged(config: TaskConfig, alpha: int, beta=1, lie: bool = False) -> tuple[bytes, bytes]:
    """A malicious client's report with a consistent MAC (`test_malicious_clients.forged`); `lie`:
    its pair (a, A) has A != a^2."""
    x0, x1 = honest_extras(config)
    x0, x1 = x0.copy(), x1.copy()
    if lie:
        x1[1] = (int(x1[1]) + 1) % P
    return forged(config, alpha, beta, (x0, x1))


@pytest.mark.parametrize("relation", RELATIONS)
def test_forged_reports_on_a_verified_factorization_task_change_nothing(servers, relation):
    """A malicious client's reports (payload 0, 2, 10^6, -1; a step off the grid; a lying check)
    on a verified zCDP factorization task: excluded at the close, and with noise off the coordinates
    are exactly R x of the honest reports (then n = the honest count under substitution)."""
    procs, _ = servers
    config, token = _task(procs["exact"], relation=relation, grid=OFF_GRID)
    assert config.verify and config.dcf().modulus == P
    vals = values(90, 24) % 49.0
    submit(config, vals, batch=45)
    bad = [_forged(config, 7, 0), _forged(config, 7, 2), _forged(config, 7, 10**6), _forged(config, 7, P - 1),
           _forged(config, 55), _forged(config, 63), _forged(config, 20, 1, lie=True)]
    reports = [seal(config, s) for s in bad]
    for url in config.servers:
        res = http("POST", f"{url}/tasks/{config.task_id}/reports/batch", encode_batch(reports),
                   content_type="application/octet-stream")
        assert res["accepted"] == len(reports)
    analyst = ClientAnalyst(config, token)
    analyst.close()
    assert sum(analyst.rejected.values()) == len(bad)
    y, n = analyst._ask({"kind": "coordinates"})
    m = config.make_grid().size
    truth = prefix_counts(vals, config.make_grid())
    np.testing.assert_array_equal(y[:m], np.convolve(np.diff(truth, prepend=0), right_factor(m))[:m])
    if relation == "substitution":
        assert y.size == m + 1 and y[m] == n == 90
    else:
        assert y.size == m and n == 0
    rel = analyst.release()
    np.testing.assert_allclose(rel.counts, truth, atol=1e-6)


def test_the_cli_refuses_bad_zcdp_tasks_cleanly(servers, tmp_path):
    """`dpcdf task` with a bad rho, a pure mechanism with --rho, the factorization with --epsilon, or
    the factorization on a grid too large for it: exit code 2 and one line, no traceback, no task file.
    (Without --mechanism such a grid takes the Gaussian tree, the policy table's choice: test_policy.)"""
    import os

    from helpers import TESTING

    procs, _ = servers
    env = dict(os.environ, **TESTING)
    for i, args in enumerate([["--rho", "nan"], ["--rho", "-1"], ["--rho", "0.5", "--mechanism", "path"],
                              ["--epsilon", "1", "--mechanism", "factorization"],
                              ["--rho", "0.5", "--mechanism", "factorization", "--grid", "uniform:0:1:14"]]):
        out = tmp_path / f"t{i}.json"
        grid = [] if "--grid" in args else ["--grid", "uniform:0:100:6"]
        run = subprocess.run([sys.executable, "-m", "dpcdf", "task", "--servers", *urls(procs["exact"]), *grid, *args,
                              "--min-batch", "0", "--out", str(out)], capture_output=True, text=True, timeout=120, env=env)
        assert run.returncode == 2 and "Traceback" not in run.stderr and run.stderr.strip(), (args, run.stderr[-400:])
        assert not out.exists()
