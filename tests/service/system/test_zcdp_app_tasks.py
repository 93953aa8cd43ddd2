"""rho-zCDP label (ROC) and calibration (Hosmer-Lemeshow) tasks on real servers (issue 25): without
noise the analyst's ROC curve and statistic are the central ones (the same mechanisms, grid, fit and
groups: one code path); with noise, what the analyst adds up is the exact group sums plus each
server's discrete Gaussian from its PRF at the variance `TaskConfig.group_scales` gives, the noise
whose law tests/release/test_zcdp_apps.py checks; and the CLI makes, fills and answers such tasks."""
from __future__ import annotations

import sqlite3
from pathlib import Path

import numpy as np
import pytest

import dpcdf
from fss import field as F
from dpcdf.analyst import Analyst
from dpcdf.release.calibration import fixed_point
from dpcdf.release.noise import prf_key
from dpcdf.release.zcdp import GaussianTreeMechanism, GaussianVariance, prf_dgauss
from dpcdf.service.client import create_task, submit
from dpcdf.service.server.aggregate import Aggregator
from dpcdf.service.task import TaskConfig
from helpers import dpcdf_cli, urls

GRID = {"kind": "uniform", "lo": 0.0, "hi": 1.0, "bits": 6}


def _seed(data_dir: Path, task_id: str) -> bytes:
    db = sqlite3.connect(str(data_dir / "server.sqlite"))
    (seed,) = db.execute("SELECT noise_seed FROM tasks WHERE task_id = ?", (task_id,)).fetchone()
    db.close()
    return bytes(seed)


def _data(n: int, seed: int):
    rng = np.random.default_rng(seed)  # the simulated data only
    p = rng.beta(2, 2, n)
    return p, (rng.random(n) < p).astype(int)


def _zero(ids, scale):
    return np.zeros(np.asarray(ids).size, np.int64)


@pytest.mark.parametrize("relation", ["substitution", "add-remove"])
def test_without_noise_the_servers_roc_is_the_central_zcdp_roc(servers, relation):
    procs, _ = servers
    config, token = create_task(urls(procs["exact"]), GRID, None, "tree", relation, min_batch=0, payload="label",
                                verify=None if relation == "substitution" else False, rho=0.5)
    p, y = _data(150, 21)
    submit(config, p, labels=y, batch=60)
    analyst = Analyst(config, token)
    two = analyst.roc()
    central = dpcdf.roc(p, y, config.make_grid(), privacy="zcdp", rho=0.5, noise=_zero)
    for a, b in ((two.fpr, central.fpr), (two.tpr, central.tpr)):
        np.testing.assert_allclose(a, b, atol=1e-9)
    assert two.auc == pytest.approx(central.auc, abs=1e-9)
    for rel in (two.positives, central.positives):
        assert isinstance(rel.mechanism, GaussianTreeMechanism) and rel.mechanism.rho == 0.25
    assert two.positives.mechanism.sigma2 == central.positives.mechanism.sigma2
    assert two.statement == central.statement and two.statement.startswith("0.5-zCDP under substitution")


def test_without_noise_the_servers_hosmer_lemeshow_is_the_central_zcdp_one(servers):
    procs, _ = servers
    config, token = create_task(urls(procs["exact"]), GRID, None, "tree", "substitution", min_batch=0,
                                payload="calibration", split=0.4, rho=0.6)
    p, y = _data(300, 22)
    submit(config, p, labels=y, batch=100)
    two = Analyst(config, token).hosmer_lemeshow(groups=5)
    central = dpcdf.hosmer_lemeshow(p, y, groups=5, bits=6, split=0.4, noise=_zero, privacy="zcdp", rho=0.6)
    np.testing.assert_allclose(two.boundaries, central.boundaries)
    np.testing.assert_allclose(two.counts, central.counts)
    np.testing.assert_allclose(two.observed, central.observed)
    np.testing.assert_allclose(two.expected, central.expected)
    assert two.statistic == pytest.approx(central.statistic, rel=1e-9)
    assert two.statement == central.statement and two.statement.startswith("0.6-zCDP under substitution")


@pytest.mark.parametrize("verify", [None, False])
def test_with_noise_the_group_sums_carry_each_servers_discrete_gaussian(servers, verify):
    """White box: the analyst's group sums less the exact ones are the two servers' N_Z(0, sigma^2)
    draws from their seeds' group keys (per element, its own domain), at the calibration task's zCDP
    variances; asked again, the same answer (once per task)."""
    procs, _ = servers
    pair = procs["noisy"]
    config, token = create_task(urls(pair), GRID, None, "tree", "substitution", min_batch=0, payload="calibration",
                                verify=verify, rho=0.5)
    scales = config.group_scales()
    assert all(isinstance(s, GaussianVariance) for s in scales)
    p, y = _data(200, 23)
    submit(config, p, labels=y)
    analyst = Analyst(config, token)
    edges = [10, 25, 40, 55]
    sums = analyst.group_sums(edges)
    grid = config.make_grid()
    group = np.searchsorted(np.array(edges), grid.index(p), side="left")  # index <= e_q -> group q
    exact = np.stack([np.bincount(group, minlength=5), np.bincount(group, weights=y, minlength=5),
                      np.bincount(group, weights=fixed_point(p), minlength=5)], axis=1).astype(np.int64)
    ids = np.arange(5, dtype=np.uint64)
    noise = np.zeros((5, 3), np.int64)
    for data_dir in (d for _, _, d in pair):
        seed = _seed(data_dir, config.task_id)
        agg = Aggregator(config.dcf(), config.make_mechanism(), seed, config.task_id)
        alone = agg.group_shares([], np.array(edges), scales)  # no keys: this server's noise alone
        alone = F.signed(alone) if agg.prime else alone.view(np.int64)
        key = prf_key(seed, f"{config.task_id}/groups")
        for e, s in enumerate(scales):
            np.testing.assert_array_equal(alone[:, e], prf_dgauss(key, ids + np.uint64((e + 1) << 32), s))
        noise += alone
    np.testing.assert_array_equal(sums, exact + noise)
    assert np.abs(noise[:, 0]).max() > 0  # sigma^2 = 12 for n: zero noise on all 5 groups is about 1e-5
    np.testing.assert_array_equal(analyst.group_sums(edges), sums)


def test_the_cli_makes_and_answers_zcdp_label_and_calibration_tasks(servers, tmp_path):
    procs, _ = servers
    p, y = _data(120, 24)
    csv = tmp_path / "scores.csv"
    csv.write_text("p,y\n" + "".join(f"{a!r},{b}\n" for a, b in zip(p.tolist(), y.tolist())))
    for payload, query in (("label", ["--roc"]), ("calibration", ["--hosmer-lemeshow", "5"])):
        task = tmp_path / f"{payload}.json"
        made = dpcdf_cli("task", "--servers", *urls(procs["noisy"]), "--grid", "uniform:0:1:6", "--rho", "0.5",
                         "--payload", payload, "--min-batch", "0", "--out", str(task))
        assert made.returncode == 0, made.stderr
        config = TaskConfig.from_json(task.read_text())
        assert (config.privacy, config.mechanism, config.payload, config.epsilon, config.rho) == ("zcdp", "tree", payload,
                                                                                                  None, 0.5)
        sent = dpcdf_cli("submit", "--task", str(task), "--csv", str(csv), "--column", "p", "--label-column", "y")
        assert sent.returncode == 0, sent.stderr
        asked = dpcdf_cli("query", "--task", str(task), *query)
        assert asked.returncode == 0, asked.stderr
        assert ("AUC = " if payload == "label" else "Hosmer-Lemeshow H = ") in asked.stdout
        assert "0.5-zCDP under substitution" in asked.stdout  # the whole release's guarantee
    bad = dpcdf_cli("task", "--servers", *urls(procs["noisy"]), "--grid", "uniform:0:1:6", "--rho", "0.5",
                    "--payload", "label", "--mechanism", "factorization", "--min-batch", "0", "--out", str(tmp_path / "x"))
    assert bad.returncode == 2 and "Gaussian tree" in bad.stderr and "Traceback" not in bad.stderr
