"""Smoothing by shrunk details (`postprocess_with="smooth"`): the batched consistent estimate, the
details' exact noise variances against a dense covariance, the noise formula the shrinkage rests on
(a statistical test), and what a user gets from `release_ecdf`."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import dpcdf
from dpcdf import Grid, metrics
from dpcdf.errors import ParameterError
from dpcdf.release import smoothing
from dpcdf.release.mechanisms import TreeMechanism
from dpcdf.release.noise import prf_noise
from dpcdf.release.zcdp import GaussianVariance, prf_dgauss


def node_arrays(mech: TreeMechanism, rng: np.random.Generator, batch: int | None = None) -> list[np.ndarray]:
    shape = lambda lv: (mech.level_nodes(lv),) if batch is None else (mech.level_nodes(lv), batch)  # noqa: E731
    return [rng.normal(0, 5, shape(lv)) for lv in range(mech.shape.height + 1)]


@settings(max_examples=25, deadline=None)
@given(size=st.integers(2, 300), branching=st.sampled_from([2, 3, 4, 11]), eps=st.sampled_from([0.1, 1.0]),
       relation=st.sampled_from(["substitution", "add-remove"]), seed=st.integers(0, 2**32 - 1))
def test_consistent_takes_a_batch_of_releases_as_columns(size, branching, eps, relation, seed):
    mech = TreeMechanism(size, eps, relation, branching=branching)
    nodes = node_arrays(mech, np.random.default_rng(seed), batch=3)  # test data, not noise
    batch = mech.consistent(nodes, copies=2)
    for col in range(3):
        np.testing.assert_allclose(batch[:, col], mech.consistent([lv[:, col] for lv in nodes], copies=2), rtol=1e-12, atol=1e-9)


def test_interpolate_keeps_the_knots_and_is_linear_between():
    c = np.array([3.0, 5.0, 9.0, 10.0, 20.0, 21.0, 22.0])
    at = smoothing.knots(7, 3, 1)
    np.testing.assert_array_equal(at, [2, 5, 6])
    s = smoothing.interpolate(c, at)
    np.testing.assert_allclose(s, [3.0, 6.0, 9.0, 13.0, 17.0, 21.0, 22.0])  # from (-1, 0) to (2, 9), then (5, 21), (6, 22)
    np.testing.assert_allclose(smoothing.interpolate(c, smoothing.knots(7, 3, 0)), c)


@pytest.mark.parametrize("size,branching,relation", [(40, 3, "substitution"), (27, 2, "add-remove"), (64, 4, "substitution")])
def test_detail_variances_are_the_diagonals_of_the_dense_covariance(size, branching, relation):
    """Sigma = C D C^T built column by column from unit noises, one release at a time."""
    mech = TreeMechanism(size, 0.5, relation, branching=branching)
    var = mech.variances()
    cols = []
    for lv in mech.released_levels():
        for i in range(mech.level_nodes(lv)):
            nodes = [np.zeros(mech.level_nodes(k)) for k in range(mech.shape.height + 1)]
            nodes[lv][i] = np.sqrt(var[lv])
            cols.append(mech.consistent(nodes))
    m = np.array(cols).T
    sigma = m @ m.T
    got = smoothing.detail_variances(mech)
    interp = [np.array([smoothing.interpolate(e, smoothing.knots(size, branching, h)) for e in np.eye(size)]).T
              for h in range(mech.shape.height + 1)]
    for h in range(mech.shape.height):
        d = interp[h] - interp[h + 1]
        np.testing.assert_allclose(got[h], np.diag(d @ sigma @ d.T), rtol=1e-9, atol=1e-6)


def test_on_linear_data_each_detail_is_pure_noise_of_the_stated_variance():
    """One value per grid point: F is a straight line, so every detail of c has mean 0 and
    E ||d_h||^2 is the sum of its stated variances; over 600 releases (exact discrete Laplace noise)
    the mean squared detail matches, within 5 standard errors, at every level."""
    grid = Grid.integers(48)
    values = np.arange(48)
    mech = TreeMechanism(48, 0.5, "substitution", branching=4)
    stated = smoothing.detail_variances(mech).sum(axis=1)
    seen = []
    for _ in range(600):
        c = dpcdf.release_ecdf(values, grid, 0.5, mech, "substitution").fitted
        levels = [smoothing.interpolate(c, smoothing.knots(48, 4, h)) for h in range(mech.shape.height + 1)]
        seen.append([((levels[h] - levels[h + 1]) ** 2).sum() for h in range(mech.shape.height)])
    seen = np.array(seen)
    se = seen.std(axis=0, ddof=1) / np.sqrt(len(seen))
    assert np.all(np.abs(seen.mean(axis=0) - stated) <= 5 * se), (seen.mean(axis=0), stated, se)


def test_smooth_release_on_near_uniform_data_beats_the_default_and_keeps_its_guarantee():
    """The paper's kind of data (Poisson(3) per grid point): the smoothed release's typical (median)
    counts MSE is a fraction of the plain fit's at eps = 0.1 (its details are mostly noise)."""
    rng = np.random.default_rng(7)  # the data only
    values = np.repeat(np.arange(256), rng.poisson(3, 256))
    grid = Grid.integers(256)
    prefix = dpcdf.prefix_counts(values, grid)
    auto, smooth = [], []
    for _ in range(12):
        a = dpcdf.release_ecdf(values, grid, 0.1, "tree", "substitution", "monotone")
        s = dpcdf.release_ecdf(values, grid, 0.1, "tree", "substitution", "smooth")
        assert s.statement == a.statement and s.counts[-1] == values.size
        assert np.all(np.diff(s.counts) >= 0)
        auto.append(metrics.mse_counts(prefix, a.counts))
        smooth.append(metrics.mse_counts(prefix, s.counts))
    assert np.median(smooth) < 0.5 * np.median(auto)


def test_the_default_smooths_tree_releases_on_grids_it_can_afford():
    """postprocess_with="auto" is "smooth" for a tree (pure or zCDP) on up to 2^12 points and the plain monotone fit otherwise (path, factorization, larger grids): the same release (a deterministic PRF
    noise, as a server's) gives the same counts."""
    key = bytes(range(16))
    noise = lambda ids, scale: (prf_dgauss(key, ids, scale) if isinstance(scale, GaussianVariance)  # noqa: E731
                                else prf_noise(key, ids, scale))
    values = np.random.default_rng(2).integers(0, 4096, 3000)  # the test's data
    cases = [(Grid.integers(256), {"epsilon": 0.5, "mechanism": "tree"}, "smooth"),
             (Grid.integers(4096), {"epsilon": 0.5, "relation": "add-remove", "mechanism": "tree"}, "smooth"),
             (Grid.integers(256), {"privacy": "zcdp", "rho": 0.5, "mechanism": "tree"}, "smooth"),
             (Grid.integers(256), {"epsilon": 0.5, "mechanism": "path"}, "monotone"),
             (Grid.integers(256), {"privacy": "zcdp", "rho": 0.5}, "monotone"),
             (Grid.integers(8192), {"epsilon": 0.5, "mechanism": "tree"}, "monotone")]
    for grid, kwargs, same_as in cases:
        default = dpcdf.release_ecdf(values % grid.size, grid, noise=noise, **kwargs)
        other = dpcdf.release_ecdf(values % grid.size, grid, noise=noise, postprocess_with=same_as, **kwargs)
        np.testing.assert_array_equal(default.counts, other.counts)
        if same_as == "smooth":
            plain = dpcdf.release_ecdf(values % grid.size, grid, noise=noise, postprocess_with="monotone", **kwargs)
            assert not np.array_equal(default.counts, plain.counts)


def test_smooth_needs_a_tree_on_a_grid_it_can_afford():
    values = np.arange(100) % 50
    with pytest.raises(ParameterError, match="needs a tree release"):
        dpcdf.release_ecdf(values, Grid.integers(50), 1.0, "path", "substitution", "smooth")
    with pytest.raises(ParameterError, match="up to"):
        dpcdf.release_ecdf(values, Grid.integers(smoothing.MAX_SMOOTH_GRID + 1), 1.0, "auto", "substitution", "smooth")
