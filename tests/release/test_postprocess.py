"""Post-processing: outputs are monotone, in range, idempotent; consistency is the exact GLS."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dpcdf import TreeMechanism
from dpcdf.release.postprocess import monotone, smooth_eq3
from dpcdf.release.tree import TreeShape

noisy_vectors = st.lists(st.floats(-50, 150, allow_nan=False), min_size=1, max_size=40).map(np.array)


@given(noisy_vectors, st.sampled_from([1, 2]))
@settings(max_examples=60)
def test_monotone_is_monotone_in_range_and_idempotent(y, p):
    x = monotone(y, 0, 100, p)
    assert np.all(np.diff(x) >= -1e-9) and x.min() >= 0 and x.max() <= 100
    np.testing.assert_allclose(monotone(x, 0, 100, p), x, atol=1e-7)
    if p == 2:  # no other monotone vector in range is closer
        other = np.clip(np.sort(y), 0, 100)
        assert np.sum((x - y) ** 2) <= np.sum((other - y) ** 2) + 1e-6


@given(noisy_vectors)
@settings(max_examples=30)
def test_known_last_value_is_kept(y):
    x = monotone(y, 0, 100, 2, last=100.0)
    assert x[-1] == 100 and np.all(np.diff(x) >= -1e-9)


def test_l1_isotonic_example():
    np.testing.assert_allclose(monotone(np.array([1.0, 3.0, 2.0, 4.0]), p=1)[[0, 3]], [1, 4])
    x = monotone(np.array([1.0, 3.0, 2.0, 4.0]), p=1)
    assert 2 <= x[1] == x[2] <= 3


@pytest.mark.parametrize("p", [1, 2])
def test_eq3_smoothing_is_monotone_in_range_and_leaves_monotone_input_alone(p):
    shape = TreeShape.for_size(16, 2)
    sets = shape.path(np.arange(16))
    rng = np.random.default_rng(1)  # the test's own data, not privacy noise
    noisy = np.cumsum(rng.integers(0, 5, 16)).astype(float) + rng.normal(0, 6, 16)
    total = 40.0
    out = smooth_eq3(noisy, sets, total, p)
    assert np.all(np.diff(out) >= 0) and out[0] >= 0 and out[-1] <= total
    already = np.linspace(1, 39, 16)
    np.testing.assert_allclose(smooth_eq3(already, sets, total, p), already, atol=1e-5)


def test_consistency_is_the_generalised_least_squares_estimate():
    """On a small tree, the two-pass estimate equals the dense GLS solution with the root fixed."""
    mech = TreeMechanism(9, 1.0, branching=3, budgets=(0.2, 0.8))
    shape = mech.shape
    rng = np.random.default_rng(2)
    leaves_true = rng.integers(0, 10, 9).astype(float)
    n = leaves_true.sum()
    nodes = [leaves_true + rng.normal(0, 3, 9), np.add.reduceat(leaves_true, [0, 3, 6]) + rng.normal(0, 1, 3), np.array([n])]
    got_prefix = mech.consistent(nodes)
    var = mech.variances()
    # dense GLS: unknown leaves x (9), observations: leaves (var0), level-1 sums (var1); constraint sum x = n
    a = np.vstack([np.eye(9), np.kron(np.eye(3), np.ones(3))])
    w = np.concatenate([np.full(9, 1 / var[0]), np.full(3, 1 / var[1])])
    z = np.concatenate([nodes[0], nodes[1]])
    kkt = np.block([[a.T @ (w[:, None] * a), np.ones((9, 1))], [np.ones((1, 9)), np.zeros((1, 1))]])
    sol = np.linalg.solve(kkt, np.concatenate([a.T @ (w * z), [n]]))
    np.testing.assert_allclose(got_prefix, np.cumsum(sol[:9]), atol=1e-8)
    assert shape.height == 2
