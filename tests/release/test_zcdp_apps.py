"""rho-zCDP for ROC (label) and Hosmer-Lemeshow (calibration), in process (issue 25): the accounting sums
to rho (exact Fractions, the group sums' L2 sensitivity brute-forced), the central APIs and a task
build the same mechanisms and noise scales (one policy table), a server's group-sum noise under zCDP
has the discrete Gaussian's law and variance, and invalid combinations are a ParameterError. The same
on real servers: tests/service/system/test_zcdp_app_tasks.py."""
from __future__ import annotations

import itertools
import secrets
from fractions import Fraction

import numpy as np
import pytest

import dpcdf
from dpcdf import ParameterError
from dpcdf.apps import hosmer_lemeshow
from dpcdf.release.calibration import FRACTION_BITS, group_scales
from dpcdf.release.policy import auto_mechanism, check_budget, curve_budget
from dpcdf.release.zcdp import GaussianTreeMechanism, GaussianVariance, dgauss_pmf, dgauss_variance
from dpcdf.service.server.aggregate import Aggregator
from dpcdf.service.task import TaskConfig
from test_zcdp_accounting import worst_rho

GRID6 = {"kind": "uniform", "lo": 0.0, "hi": 1.0, "bits": 6}


def _cfg(payload: str, rho: float = 0.5, **change) -> TaskConfig:
    base = dict(grid=GRID6, epsilon=None, mechanism="tree", relation="substitution", min_batch=0,
                servers=("http://a", "http://b"), hpke_keys=("00", "01"), token_hash="0" * 64, privacy="zcdp", rho=rho,
                payload=payload, verify=False, task_id="t1")
    return TaskConfig(**(base | change))


def _data(n: int = 400, seed: int = 3):
    rng = np.random.default_rng(seed)  # the simulated data only
    p = rng.beta(2, 2, n)
    return p, (rng.random(n) < p).astype(int)


class Recorder:
    """A noise function that adds no noise and records each scale it is asked for."""

    def __init__(self):
        self.scales = []

    def __call__(self, ids, scale):
        self.scales.append(scale)
        return np.zeros(np.asarray(ids).size, np.int64)


# --- the policy table and the accounting --------------------------------------------------------
@pytest.mark.parametrize("payload", ["label", "calibration"])
@pytest.mark.parametrize("privacy", ["pure", "zcdp"])
def test_auto_is_the_tree_for_label_and_calibration(payload, privacy):
    assert auto_mechanism(64, "substitution", privacy, 1.0, payload) == "tree"
    assert TaskConfig.default_mechanism(GRID6, "substitution", privacy, None, payload) == "tree"


@pytest.mark.parametrize("relation", ["substitution", "add-remove"])
def test_a_label_task_spends_half_of_rho_per_curve_and_rho_in_all(relation):
    rho = 0.5
    mech = _cfg("label", rho, relation=relation).make_mechanism()
    assert isinstance(mech, GaussianTreeMechanism) and mech.relation == "add-remove" and mech.rho == rho / 2
    per_curve = mech.exact_rho("add-remove")
    assert per_curve == worst_rho(mech, "add-remove") <= Fraction(rho) / 2  # brute force of the release
    assert Fraction(rho) / 2 - per_curve < Fraction(rho) / 10**5
    # substitution: within one curve (the brute-forced worst pair) or one removal and one addition across them
    within = worst_rho(mech, "substitution")  # the noised root does not change: below the stated bound
    assert within <= mech.exact_rho("substitution") == 2 * per_curve
    assert max(within, per_curve + per_curve) <= Fraction(rho)


def test_a_calibration_task_spends_split_rho_on_the_ecdf_and_the_rest_on_the_groups():
    rho, split = 0.6, 0.3
    config = _cfg("calibration", rho, split=split)
    ecdf = config.make_mechanism()
    assert (ecdf.rho, ecdf.relation) == (pytest.approx(rho * split), "substitution")
    assert ecdf.exact_rho("substitution") == worst_rho(ecdf, "substitution") <= Fraction(rho * split)
    scales = config.group_scales()
    assert scales == group_scales(rho, split, "zcdp") and all(isinstance(s, GaussianVariance) for s in scales)
    # the L2 squared sensitivity of each group vector, brute-forced: one person (group, label, probability in
    # units of 2^-16) replaced by another, over 3 groups and the extreme probabilities
    worst = [0, 0, 0]
    one = 1 << FRACTION_BITS
    for q, y, f, q2, y2, f2 in itertools.product(range(3), (0, 1), (0, 1, one // 2, one), repeat=2):
        before, after = np.zeros((3, 3), np.int64), np.zeros((3, 3), np.int64)
        before[:, q], after[:, q2] = (1, y, f), (1, y2, f2)
        for k in range(3):
            worst[k] = max(worst[k], int(((after[k] - before[k]) ** 2).sum()))
    assert worst == [2, 2, 2 * one**2]
    groups = sum(Fraction(d) / (2 * Fraction(s)) for d, s in zip(worst, scales))
    assert groups <= Fraction(rho) * (1 - Fraction(split))  # sigma^2 rounded up: never more than the share
    total = ecdf.exact_rho("substitution") + groups
    assert total <= Fraction(rho) and Fraction(rho) - total < Fraction(rho) / 10**5  # and the budget is used up


def test_the_pure_group_scales_are_unchanged():
    assert group_scales(1.0, 0.5) == group_scales(1.0, 0.5, "pure")
    assert not any(isinstance(s, GaussianVariance) for s in group_scales(1.0, 0.5))


# --- central and task: the same mechanisms and noise --------------------------------------------
def test_the_central_roc_builds_the_label_tasks_curves():
    p, y = _data()
    grid = dpcdf.Grid.uniform(0.0, 1.0, 6)
    roc = dpcdf.roc(p, y, grid, privacy="zcdp", rho=0.5)
    task = _cfg("label", 0.5).make_mechanism()
    for rel in (roc.positives, roc.negatives):
        assert isinstance(rel.mechanism, GaussianTreeMechanism)
        assert (rel.mechanism.sigma2, rel.mechanism.relation, rel.mechanism.scales) == (task.sigma2, task.relation, task.scales)
    assert (roc.epsilon, roc.rho) == (None, 0.5) and 0.5 < roc.auc <= 1
    assert roc.statement.startswith("0.5-zCDP under substitution") and "0.25-zCDP under add/remove" in roc.statement


def test_the_central_hosmer_lemeshow_uses_the_calibration_tasks_noise():
    p, y = _data()
    rec = Recorder()
    hl = dpcdf.hosmer_lemeshow(p, y, groups=5, bits=6, split=0.4, noise=rec, privacy="zcdp", rho=0.8)
    config = _cfg("calibration", 0.8, split=0.4)
    tree = config.make_mechanism()
    assert set(rec.scales[:-3]) == {tree.sigma2} and rec.scales[-3:] == config.group_scales()
    assert all(isinstance(s, GaussianVariance) for s in rec.scales)
    assert hl.statistic == pytest.approx(hosmer_lemeshow.exact_hosmer_lemeshow(p, y, hl.boundaries), rel=1e-3)
    assert hl.statement.startswith("0.8-zCDP under substitution") and 0 < hl.noise_aware_p_value <= 1


def test_the_noise_aware_p_value_simulates_the_discrete_gaussian_under_zcdp():
    """Calibrated data: the simulated reference matches the release's noise law, so the p-value of a
    noiseless H is large with weak noise and with strong noise (the reference widens with sigma)."""
    n, e = np.full(10, 500.0), np.full(10, 250.0)
    for rho in (100.0, 0.01):
        scales = group_scales(rho, 0.5, "zcdp")
        assert hosmer_lemeshow.noise_aware_p_value(8.0, n, e, scales, copies=2) > 0.2
    weak = hosmer_lemeshow.noise_aware_p_value(60.0, n, e, group_scales(100.0, 0.5, "zcdp"))
    strong = hosmer_lemeshow.noise_aware_p_value(60.0, n, e, group_scales(0.01, 0.5, "zcdp"))
    assert weak < 0.01 < strong


# --- a server's group sums under zCDP: the discrete Gaussian's law ------------------------------
def test_a_servers_group_sum_noise_has_the_discrete_gaussians_variance():
    """The noise a server adds to a zCDP calibration task's group sums (its key shares left out: the
    noise alone), 1024 groups a seed and 4 seeds: each element's sample variance is the discrete
    Gaussian's within 5 standard errors, and the count vector's histogram fits N_Z's pmf (chi-square)."""
    config = _cfg("calibration", 3.0, grid={"kind": "uniform", "lo": 0.0, "hi": 1.0, "bits": 10})
    scales = config.group_scales()  # rho_3 = 0.5: sigma^2 = 2 for n and O, 2^32 * 2 for E
    assert [float(s) for s in scales] == [pytest.approx(2.0), pytest.approx(2.0), pytest.approx(2.0 * 2**32)]
    edges = np.arange(config.make_grid().size - 1)
    draws = []
    for _ in range(4):
        agg = Aggregator(config.dcf(), config.make_mechanism(), secrets.token_bytes(32), config.task_id)
        draws.append(agg.group_shares([], edges, scales).view(np.int64))
    noise = np.concatenate(draws)
    m = noise.shape[0]
    assert m == 4 * 1024
    for k, s in enumerate(scales):
        var = dgauss_variance(float(s))
        se = var * np.sqrt(2.0 / m)  # sd of the sample variance (kurtosis 3)
        assert abs(noise[:, k].astype(np.float64).var() - var) < 5 * se, (k, noise[:, k].var(), var)
    assert noise[:, 0].var() != noise[:, 1].var()  # independent PRF domains per element
    support = np.arange(-6, 7)
    want = dgauss_pmf(float(scales[0]), support) * m
    got = np.array([(noise[:, 0] == v).sum() for v in support])
    chi2 = (((got - want) ** 2) / want).sum()
    assert chi2 < 60, chi2  # 12 dof: P(chi2 > 60) ~ 2e-8 (at 40, 7e-5: a CI run drew 44.8); a DLap of the same variance
    # gives several hundred


# --- refusals ---------------------------------------------------------------------------------
@pytest.mark.parametrize("change, match", [
    (dict(payload="label", mechanism="factorization"), "Gaussian tree"),
    (dict(payload="calibration", mechanism="factorization"), "Gaussian tree"),
    (dict(payload="label", mechanism="path"), "'factorization' or 'tree'"),
    (dict(payload="calibration", relation="add-remove"), "calibration task needs relation 'substitution'"),
    (dict(payload="label", epsilon=1.0), "takes rho, not epsilon"),
    (dict(payload="label", rho=None), "rho must be"),
    (dict(payload="calibration", split=1.0), "split"),
])
def test_invalid_zcdp_label_and_calibration_tasks_are_refused(change, match):
    with pytest.raises(ParameterError, match=match):
        _cfg(change.pop("payload"), **change)


@pytest.mark.parametrize("app", ["roc", "hosmer_lemeshow"])
@pytest.mark.parametrize("kwargs, match", [
    (dict(epsilon=1.0, privacy="zcdp", rho=0.5), "takes rho, not epsilon"),
    (dict(privacy="zcdp"), "rho must be"),
    (dict(privacy="zcdp", rho=-1.0), "rho must be"),
    (dict(epsilon=1.0, rho=0.5), "rho is for privacy='zcdp'"),
    (dict(privacy="renyi", rho=0.5), "privacy must be"),
])
def test_invalid_central_budgets_are_refused(app, kwargs, match):
    p, y = _data(50)
    with pytest.raises(ParameterError, match=match):
        if app == "roc":
            dpcdf.roc(p, y, dpcdf.Grid.uniform(0.0, 1.0, 4), **kwargs)
        else:
            dpcdf.hosmer_lemeshow(p, y, **kwargs)
    with pytest.raises(ParameterError):
        check_budget(kwargs.get("privacy", "pure"), kwargs.get("epsilon"), kwargs.get("rho"))


def test_a_zcdp_label_task_round_trips_through_json_and_pure_ones_keep_their_json():
    config = _cfg("label", 0.5)
    again = TaskConfig.from_json(config.to_json())
    assert again == config and again.fingerprint == config.fingerprint
    pure = TaskConfig.from_json(_cfg("label", privacy="pure", rho=None, epsilon=1.0).to_json())
    assert "privacy" not in pure.to_json() and "rho" not in pure.to_json()
    assert curve_budget("label", 0.5, "substitution") == (0.25, "add-remove")
