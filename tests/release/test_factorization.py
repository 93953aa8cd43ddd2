"""The rho-zCDP square-root factorization: L R = A exactly on data, the exact sensitivity against a
brute force over all neighbours of the mechanism's own release, the conditioning on n against a
dense covariance, the error formula and the noise's distribution, its gain over the tree, the
statements, refusals, and pinned vectors (tests/vectors/factorization_v1.json)."""
from __future__ import annotations

import hashlib
import json
import math
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import dpcdf
from helpers import neighbour_prefixes
from dpcdf.release.ecdf import finish_release, secure_node_noise
from dpcdf.release.factorization import (MAX_FACTOR_GRID, SqrtFactorizationMechanism, column_sensitivities, last_prefix_gain,
                                         left_factor, right_factor, sqrt_factorization)
from dpcdf.release.zcdp import dgauss_variance, gaussian_tree, zcdp_to_dp

RELATIONS = ["substitution", "add-remove"]
VECTORS = json.loads((Path(__file__).resolve().parents[1] / "vectors" / "factorization_v1.json").read_text())


def no_noise(ids, scale):
    return np.zeros(np.asarray(ids).size, np.int64)


@pytest.mark.parametrize("relation", RELATIONS)
@pytest.mark.parametrize("size", [2, 3, 7, 16, 33, 64])
def test_exact_rho_is_the_brute_force_worst_case(size, relation):
    """max over neighbours of ||y - y'||^2 / (2 sigma^2) from the mechanism's own noiseless release;
    the appended n (substitution) must never change."""
    rho = 0.3
    mech = sqrt_factorization(size, rho, relation)
    worst = 0
    for p, q in neighbour_prefixes(size, relation):
        a, b = mech.noisy(p, no_noise), mech.noisy(q, no_noise)
        if relation == "substitution":
            assert a[-1] == b[-1]  # n, released without noise
            a, b = a[:-1], b[:-1]
        worst = max(worst, int(((a - b) ** 2).sum()))
    assert worst == mech.l2_sensitivity(relation)
    exact = Fraction(worst) / (2 * Fraction(mech.sigma2))
    assert mech.exact_rho(relation) == exact <= Fraction(rho)
    assert Fraction(rho) - exact < Fraction(rho) * Fraction(1, 10**5)  # the budget is used up


@pytest.mark.parametrize("size", [2, 9, 40])
def test_sensitivities_are_the_dense_maxima(size):
    r = np.zeros((size, size), np.int64)
    for i in range(size):
        r[i:, i] = right_factor(size)[: size - i]
    single = max(int((r[:, i] ** 2).sum()) for i in range(size))
    pair = max(int(((r[:, i] - r[:, j]) ** 2).sum()) for i in range(size) for j in range(size))
    assert column_sensitivities(size) == (single, pair)


@settings(max_examples=40, deadline=None)
@given(size=st.integers(2, 300), relation=st.sampled_from(RELATIONS), seed=st.integers(0, 2**32 - 1),
       n=st.sampled_from([1, 17, 5000]))
def test_the_noiseless_release_gives_the_prefix_counts_back(size, relation, seed, n):
    """L (R x) = A x: the factorization is exact on data (float error only), also at the edges 0, N - 1."""
    rng = np.random.default_rng(seed)  # the test's data
    values = np.concatenate([rng.integers(0, size, n), [0, size - 1]])
    prefix = dpcdf.prefix_counts(values, dpcdf.Grid.integers(size))
    mech = sqrt_factorization(size, 0.5, relation)
    raw, fitted = mech.estimate(mech.noisy(prefix, no_noise))
    assert np.allclose(raw, prefix, atol=1e-6 * prefix[-1]) and np.allclose(fitted, prefix, atol=1e-6 * prefix[-1])
    assert relation == "add-remove" or fitted[-1] == prefix[-1]  # conditioned on the public n: exact


def test_a_batch_of_releases_is_estimated_column_by_column():
    mech = sqrt_factorization(100, 0.5, "substitution")
    ys = np.random.default_rng(1).normal(0, 50, (101, 3))  # arbitrary releases
    raw, fitted = mech.estimate(ys)
    for e in range(3):
        r, f = mech.estimate(ys[:, e])
        assert np.allclose(raw[:, e], r) and np.allclose(fitted[:, e], f)
    assert len(mech.elements(ys)) == 3


@pytest.mark.parametrize("size", [5, 64])
def test_conditioning_on_n_matches_a_dense_covariance(size):
    lf = np.zeros((size, size))
    for i in range(size):
        lf[i, : i + 1] = left_factor(size)[i::-1]
    cov = lf @ lf.T
    gain, trace = last_prefix_gain(size)
    assert np.allclose(gain, cov[:, -1] / cov[-1, -1])
    assert math.isclose(trace, np.trace(cov - np.outer(cov[:, -1], cov[:, -1]) / cov[-1, -1]), rel_tol=1e-9)
    # and L R = A as matrices
    r = np.zeros((size, size))
    for i in range(size):
        r[i:, i] = right_factor(size)[: size - i]
    assert np.allclose(lf @ r, np.tril(np.ones((size, size))), atol=1e-9)


@pytest.mark.parametrize("relation", RELATIONS)
def test_release_error_matches_the_formula_and_the_noise_is_the_discrete_gaussian(relation):
    """60 releases of fixed data at N = 256: the fitted estimate's mean squared error is the stated
    expected_mse (the 60-run mean's sd is 5% of it, heavy-tailed: 1,500 simulated releases put it
    0.2 away in 2-5 of 10^4 resamples, 0.3 away in none of 4 x 10^4: bound 0.3, which a variance off
    by a factor 1.5 still fails); the noise R x - y has the variance of N_Z(0, sigma^2) (15,360 draws,
    bound 5 standard errors) and mean 0."""
    size, rho = 256, 0.5
    grid = dpcdf.Grid.integers(size)
    values = np.random.default_rng(3).integers(0, size, 700)  # the test's data
    prefix = dpcdf.prefix_counts(values, grid)
    mech = sqrt_factorization(size, rho, relation)
    exact = mech.noisy(prefix, no_noise)
    errs, noise = [], []
    for _ in range(60):
        y = mech.noisy(prefix, secure_node_noise)
        noise.append((y - exact)[:size])
        errs.append(np.mean((mech.estimate(y)[1] - prefix) ** 2))
    assert abs(np.mean(errs) / mech.expected_mse() - 1) < 0.3
    z = np.concatenate(noise) / math.sqrt(float(mech.sigma2))
    var = dgauss_variance(float(mech.sigma2)) / float(mech.sigma2)
    assert abs(z.var() - var) < 5 * var * math.sqrt(2 / z.size)
    assert abs(z.mean()) < 5 * math.sqrt(var / z.size)


@pytest.mark.parametrize("relation, bound", [("substitution", 0.75), ("add-remove", 0.75)])
def test_the_factorization_beats_the_consistent_tree_at_the_same_rho(relation, bound):
    """Exact expected squared errors per prefix at N = 1024 (no simulation): the tree's consistent
    estimate's covariance from its response to every node's unit noise (as `smoothing` computes it)."""
    size, rho = 1024, 0.5
    tree = gaussian_tree(size, rho, relation)
    var = tree.variances()
    levels = [tree.level_nodes(lv) for lv in range(tree.shape.height + 1)]
    noised = [(lv, i) for lv in tree.released_levels() if var[lv] > 0 for i in range(levels[lv])]
    nodes = [np.zeros((levels[lv], len(noised))) for lv in range(len(levels))]
    for col, (lv, i) in enumerate(noised):
        nodes[lv][i, col] = math.sqrt(var[lv])
    tree_mse = float((tree.consistent(nodes) ** 2).sum() / size)
    fact = sqrt_factorization(size, rho, relation)
    assert fact.expected_mse() <= bound * tree_mse


def test_guarantee_in_rho_and_epsilon_delta():
    for relation in RELATIONS:
        mech = sqrt_factorization(1024, 0.5, relation)
        assert 0.5 * (1 - 1e-5) <= mech.rho_for(relation) <= 0.5
        assert mech.epsilon_for(relation, 1e-6) == pytest.approx(zcdp_to_dp(mech.rho_for(relation), 1e-6))
        assert f"under {relation}" in mech.statement() and "zCDP" in mech.statement()
    sub = sqrt_factorization(64, 0.5, "substitution")
    assert sub.rho_for("add-remove") == math.inf and "no DP guarantee" in sub.statement("add-remove")
    add = sqrt_factorization(64, 0.5, "add-remove")  # its substitution guarantee: the pair sensitivity
    assert add.exact_rho("substitution") == Fraction(column_sensitivities(64)[1]) / (2 * Fraction(add.sigma2))


def test_release_ecdf_takes_it_as_the_zcdp_default():
    grid = dpcdf.Grid.integers(512)
    values = np.random.default_rng(5).integers(0, 512, 900)  # the test's data
    for relation in RELATIONS:
        rel = dpcdf.release_ecdf(values, grid, privacy="zcdp", rho=0.5, relation=relation)
        assert isinstance(rel.mechanism, SqrtFactorizationMechanism) and "square-root factorization" in rel.statement
        assert np.all(np.diff(rel.counts) >= 0) and rel.counts[0] >= 0
        assert rel.total == 900 or relation == "add-remove"
    tree = dpcdf.release_ecdf(values, grid, privacy="zcdp", rho=0.5, mechanism="tree")
    assert tree.mechanism.name == "gaussian-tree"
    big = dpcdf.Grid.integers(MAX_FACTOR_GRID * 2)
    assert dpcdf.release_ecdf([1, 2, 3], big, privacy="zcdp", rho=0.5).mechanism.name == "gaussian-tree"


@pytest.mark.parametrize("kwargs, match", [
    ({"size": 1}, "grids of 2"), ({"size": MAX_FACTOR_GRID + 1}, "grids of 2"), ({"size": 2.5}, "grids of 2"),
    ({"rho": 0}, "rho"), ({"rho": float("nan")}, "rho"), ({"relation": "swap"}, "relation")])
def test_bad_parameters_are_refused(kwargs, match):
    args = {"size": 64, "rho": 0.5, "relation": "substitution"} | kwargs
    with pytest.raises(dpcdf.ParameterError, match=match):
        SqrtFactorizationMechanism(**args)


def test_tree_only_post_processing_and_the_servers_refuse_it_clearly():
    grid = dpcdf.Grid.integers(64)
    for post in ("sparse", "smooth"):
        with pytest.raises(dpcdf.ParameterError, match="tree"):
            dpcdf.release_ecdf([1, 5, 9], grid, privacy="zcdp", rho=0.5, mechanism="factorization", postprocess_with=post)
    mech = sqrt_factorization(64, 0.5)
    with pytest.raises(dpcdf.ParameterError, match="coordinates"):
        mech.gather(lambda idx: idx, lambda level: level)
    with pytest.raises(dpcdf.ParameterError, match="has 65 values"):
        mech.gather(None, None, lambda: np.zeros(64))
    with pytest.raises(dpcdf.ParameterError, match="the mechanism's rho"):
        dpcdf.release_ecdf([1, 5, 9], grid, privacy="zcdp", rho=0.25, mechanism=mech)


def test_post_processing_keeps_a_zero_noise_release_exact():
    grid = dpcdf.Grid.integers(128)
    values = np.random.default_rng(9).integers(0, 128, 300)  # the test's data
    prefix = dpcdf.prefix_counts(values, grid)
    mech = sqrt_factorization(128, 0.5, "add-remove")
    rel = finish_release(grid, mech, mech.noisy(prefix, no_noise), values.size)
    assert np.allclose(rel.counts, prefix, atol=1e-6) and rel.total == pytest.approx(300)


@pytest.mark.parametrize("case", VECTORS["cases"], ids=lambda c: f"N={c['size']}")
def test_pinned_vectors(case):
    size, rho = case["size"], VECTORS["rho"]
    r = right_factor(size)
    assert [int(v) for v in r[:16]] == case["r_head"]
    assert hashlib.sha256(r.astype("<i8").tobytes()).hexdigest() == case["r_sha256"]
    assert column_sensitivities(size) == (case["single"], case["pair"])
    for relation in RELATIONS:
        mech = sqrt_factorization(size, rho, relation)
        assert mech.sigma2 == Fraction(case[relation]["sigma2"])
        if "estimate" in case[relation]:
            y = ((7 * np.arange(size)) % 101 - 50).astype(np.float64)
            y = np.append(y, 1000.0) if relation == "substitution" else y
            assert np.allclose(mech.estimate(y)[1], case[relation]["estimate"], atol=1e-5)
