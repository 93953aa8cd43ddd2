"""rho-zCDP tasks over the two servers (issue 14): the square-root factorization and the Gaussian
tree, each server adding its own exact discrete Gaussian from its PRF. Real server processes on
loopback, real HPKE, real SQLite; the CLI as a user runs it."""
from __future__ import annotations

import math
import secrets
import sqlite3
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest

from fss import field as F
from dpcdf import DpcdfError, ParameterError
from dpcdf.analyst import Analyst
from dpcdf.release.ecdf import prefix_counts
from dpcdf.release.factorization import right_factor_times, sqrt_factorization
from dpcdf.release.zcdp import PrfStream, dgauss_pmf, dgauss_variance, prf_dgauss
from dpcdf.service.server.aggregate import Aggregator
from dpcdf.service.client import create_task, submit
from dpcdf.service.http import ServerError
from dpcdf.service.task import TaskConfig
from helpers import dpcdf_cli, GRID, urls, values


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
