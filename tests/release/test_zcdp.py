"""The exact discrete Gaussian and the rho-zCDP tree release (sized to run in seconds)."""
import math
from fractions import Fraction

import numpy as np
import pytest

import dpcdf
from dpcdf.release.zcdp import dgauss_pmf, dgauss_variance, gaussian_tree, secure_dgauss, zcdp_to_dp

SIGMA2 = Fraction(9, 2)
SAMPLES = 20_000


@pytest.fixture(scope="module")
def draws():
    return secure_dgauss(SAMPLES, SIGMA2)


def test_variance_matches_the_exact_distribution(draws):
    var = dgauss_variance(float(SIGMA2))
    assert abs(var - 4.5) < 1e-3  # at this sigma the discrete variance is sigma^2 to 3 decimals
    se = var * math.sqrt(2 / SAMPLES) * 1.2  # the sample variance's standard error (kurtosis ~3)
    assert abs(draws.var() - var) < 5 * se
    assert abs(draws.mean()) < 5 * math.sqrt(var / SAMPLES)


@pytest.mark.parametrize("k", [0, 2, 4, 6, 8])
def test_tail_probabilities_match_the_exact_distribution(draws, k):
    ys = np.arange(k, 60)
    p = 2 * dgauss_pmf(float(SIGMA2), ys).sum() - (dgauss_pmf(float(SIGMA2), [0])[0] if k == 0 else 0.0)  # P(|Y| >= k)
    got = np.mean(np.abs(draws) >= k)
    assert abs(got - p) < 5 * math.sqrt(p * (1 - p) / SAMPLES) + 1e-4


def test_point_probabilities_match(draws):
    for y in (0, 1, -1, 3, -3):
        p = dgauss_pmf(float(SIGMA2), [y])[0]
        assert abs(np.mean(draws == y) - p) < 5 * math.sqrt(p * (1 - p) / SAMPLES)


def test_release_error_matches_the_formula():
    grid = dpcdf.Grid.integers(256)
    values = np.random.default_rng(3).integers(0, 256, 500)  # the test's data, not privacy noise
    prefix = dpcdf.prefix_counts(values, grid)
    mech = gaussian_tree(256, 1.0, "add-remove")
    errs = [np.mean((dpcdf.release_ecdf(values, grid, privacy="zcdp", rho=1.0, relation="add-remove",
                                        mechanism=mech, postprocess_with="none").raw - prefix) ** 2) for _ in range(40)]
    assert abs(np.mean(errs) / mech.expected_mse() - 1) < 0.25
    # the consistent, monotone release is better than the raw covering estimator
    fitted = [np.mean((dpcdf.release_ecdf(values, grid, privacy="zcdp", rho=1.0, relation="add-remove").counts - prefix) ** 2)
              for _ in range(20)]
    assert np.mean(fitted) < np.mean(errs)


def test_guarantee_in_rho_and_epsilon_delta():
    for relation in ("substitution", "add-remove"):
        mech = gaussian_tree(1024, 0.5, relation)
        assert 0.5 * (1 - 1e-5) <= mech.rho_for(relation) <= 0.5
        assert mech.epsilon_for(relation, 1e-6) == pytest.approx(zcdp_to_dp(mech.rho_for(relation), 1e-6))
        assert "zCDP under " + relation in mech.statement()
    assert zcdp_to_dp(0.5, 1e-6) == pytest.approx(0.5 + 2 * math.sqrt(0.5 * math.log(1e6)))
    sub = gaussian_tree(1024, 0.5, "substitution")
    assert math.isinf(sub.rho_for("add-remove")) and "no DP guarantee" in sub.statement("add-remove")
    # add/remove: unit sensitivity per level, the root noised: 11 levels for 2^10 leaves
    ar = gaussian_tree(1024, 0.5, "add-remove")
    assert ar.rho_for("substitution") == pytest.approx(2 * ar.rho_for("add-remove"))


@pytest.mark.parametrize("rho", [0, -1, float("nan"), float("inf"), True, "1", 1e-12, None])
def test_bad_rho_is_refused(rho):
    with pytest.raises(dpcdf.ParameterError):
        dpcdf.release_ecdf([1.0, 2.0], dpcdf.Grid.integers(8), privacy="zcdp", rho=rho)


def test_bad_combinations_are_refused():
    g = dpcdf.Grid.integers(8)
    with pytest.raises(dpcdf.ParameterError):
        dpcdf.release_ecdf([1.0], g, 1.0, privacy="zcdp", rho=0.5)
    with pytest.raises(dpcdf.ParameterError):
        dpcdf.release_ecdf([1.0], g, 1.0, rho=0.5)
    with pytest.raises(dpcdf.ParameterError):
        dpcdf.release_ecdf([1.0], g, privacy="zcdp", rho=0.5, mechanism="path")
    with pytest.raises(dpcdf.ParameterError):
        dpcdf.release_ecdf([1.0], g, privacy="renyi", rho=0.5)
