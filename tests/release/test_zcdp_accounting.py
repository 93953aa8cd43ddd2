"""The rho-zCDP accounting of the discrete Gaussian tree, pinned exactly, and the benchmark's
calibration of OpenDP's Gaussian tree at the same rho (issue 14).

rho-zCDP of independent discrete Gaussians N_Z(0, sigma_l^2) on node counts: a neighbour pair whose
node counts differ by d gives sum_l ||d_l||^2 / (2 sigma_l^2) (CKS 2020, Theorem 14). The tests
brute-force max ||d_l||^2 over all neighbour pairs from the release's own node counts and check the
mechanism's sigma^2 and `exact_rho` against it as Fractions.
"""
from __future__ import annotations

import importlib.util
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest

import dpcdf
from helpers import neighbour_prefixes
from dpcdf.release.mechanisms import node_counts
from dpcdf.release.zcdp import gaussian_tree

ROOT = Path(__file__).resolve().parents[2]


def worst_rho(mech, relation: str) -> Fraction:
    """max over neighbours of sum over released levels of ||d_l||^2 / (2 sigma_l^2), exactly; a
    released level without noise (the public root under substitution) must not change at all."""
    worst = Fraction(0)
    for p, q in neighbour_prefixes(mech.size, relation):
        total = Fraction(0)
        for level in mech.released_levels():
            d = node_counts(p, mech.shape, level) - node_counts(q, mech.shape, level)
            sq = int((d**2).sum())
            if mech.scales[level] is None:
                assert sq == 0, f"level {level} is released without noise but changes"
            else:
                total += Fraction(sq) / (2 * Fraction(mech.scales[level]))
        worst = max(worst, total)
    return worst


@pytest.mark.parametrize("relation", ["substitution", "add-remove"])
@pytest.mark.parametrize("size", [2, 5, 8, 12, 16, 32])
def test_exact_rho_is_the_brute_force_worst_case(size, relation):
    rho = 0.3
    mech = gaussian_tree(size, rho, relation)
    worst = worst_rho(mech, relation)
    assert mech.exact_rho(relation) == worst  # the code's formula H Delta2 / (2 sigma^2) is attained, not loose
    assert worst <= Fraction(rho)
    assert Fraction(rho) - worst < Fraction(rho) * Fraction(1, 10**5)  # and the budget is used up


@pytest.mark.parametrize("relation, levels, delta2", [("substitution", 10, 2), ("add-remove", 11, 1)])
@pytest.mark.parametrize("rho", [0.005, 0.125, 0.5])
def test_sigma2_per_level_on_the_benchmark_grid(relation, levels, delta2, rho):
    """2^10 leaves: substitution noises the 10 levels below the public root with Delta2 = 2 each
    (sigma^2 = 10 / rho: 2000, 80, 20); add/remove noises all 11 with Delta2 = 1 (sigma^2 = 11 / (2 rho):
    1100, 44, 11). sigma^2 is rounded up by at most 2^-20."""
    mech = gaussian_tree(1024, rho, relation)
    assert mech.noised_levels() == list(range(levels))
    want = Fraction(levels * delta2) / (2 * Fraction(rho))
    for level in range(11):
        s = mech.scales[level]
        if level < levels:
            assert want <= Fraction(s) <= want + Fraction(1, 1 << 20)
        else:
            assert s is None  # the public root (n) under substitution
    assert float(mech.sigma2) == pytest.approx({"substitution": 10, "add-remove": 5.5}[relation] / rho, rel=1e-9)
    # the worst neighbour pair (first vs last leaf) attains Delta2 at every noised level
    exact = mech.exact_rho(relation)
    assert exact == Fraction(levels * delta2) / (2 * Fraction(mech.sigma2)) and exact <= Fraction(rho)


@pytest.mark.parametrize("relation", ["substitution", "add-remove"])
def test_realized_node_noise_has_the_calibrated_variance(relation):
    """The noise a release actually adds to the node counts (noisy minus exact, pooled over the noised
    levels of a 2^10 grid) has the discrete Gaussian's variance for sigma^2 = 10 / rho (substitution)
    or 11 / (2 rho) (add/remove); the public root gets none."""
    rho = 0.5
    mech = gaussian_tree(1024, rho, relation)
    values = np.random.default_rng(2).integers(0, 1024, 3000)  # the test's data, not privacy noise
    prefix = dpcdf.prefix_counts(values, dpcdf.Grid.integers(1024))
    from dpcdf.release.ecdf import secure_node_noise

    noise = []
    for _ in range(10):
        release = mech.noisy(prefix, secure_node_noise)
        for level in mech.noised_levels():
            noise.append(release[level] - node_counts(prefix, mech.shape, level))
        if relation == "substitution":
            assert release[10][0] == 3000
    noise = np.concatenate(noise)
    var = {"substitution": 20.0, "add-remove": 11.0}[relation]  # the discrete variance equals sigma^2 here to 1e-9
    se = var * np.sqrt(2 / noise.size)
    assert abs(noise.var() - var) < 5 * se
    assert abs(mech.variances()[0] - var) < 1e-6


def _bench():
    spec = importlib.util.spec_from_file_location("bench_accuracy", ROOT / "bench" / "bench_accuracy.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("size", [2, 4, 8, 16])
def test_benchmark_calibrates_a_full_tree_with_its_exact_l2_sensitivity(size):
    """OpenDP's tree holds every level, the root included; the benchmark calibrates its Gaussian with
    Delta2 = 2 (layers - 1) (substitution) or layers (add/remove): the brute-force worst case."""
    bench = _bench()
    layers = size.bit_length()  # log2(size) + 1

    def nodes(prefix):
        return np.concatenate([np.diff(np.concatenate([[0], prefix[2**lv - 1::2**lv]])) for lv in range(layers)])

    for relation in ("substitution", "add-remove"):
        worst = max(int(((nodes(p) - nodes(q)) ** 2).sum()) for p, q in neighbour_prefixes(size, relation))
        assert bench.tree_l2_sq_sensitivity(layers, relation) == worst
    # on the benchmark's grid both sides then use the same sigma^2 per node at the same rho
    assert bench.tree_l2_sq_sensitivity(11, "substitution") / (2 * 0.005) == pytest.approx(float(gaussian_tree(1024, 0.005).sigma2))
    assert bench.tree_l2_sq_sensitivity(11, "add-remove") / (2 * 0.005) == pytest.approx(
        float(gaussian_tree(1024, 0.005, "add-remove").sigma2))
