"""Plan version 7 of the adaptive release (the default before version 8, `test_plan_version_8`): under add/remove round zero counts round one's
fine bins (not the grid), and data whose point masses no histogram could be kept on take the whole tree
below the route's n too (`adaptive_route.RoutedRelease.screened`). Substitution is version 6's."""
from __future__ import annotations

import math

import numpy as np
import pytest

import dpcdf
from dpcdf import Grid, TreeMechanism
from dpcdf.release.adaptive import AdaptiveMechanism, min_adaptive_epsilon
from dpcdf.release.ecdf import finish_release
from dpcdf.release.noise import dlaplace_variance, prf_noise


def _release(mech, prefix, k: int):
    return finish_release(Grid.integers(mech.size), mech, mech.noisy(prefix, lambda ids, scale: prf_noise(bytes([k, 9]) * 8, ids, scale)),
                          int(prefix[-1]))


def test_point_masses_below_the_routes_n_take_the_whole_tree():
    """A normal rounded to integers (about 20 distinct values) on a uniform grid of 2^12 over [0, 100],
    n = 6,000, add/remove, eps 1: below the route's n (6,715), so version 6 runs the rounds (which end in
    the tree, about 1.3x its error), while version 7's round zero sees the point masses and takes the
    whole tree: the tree at 98% of epsilon, 1.04x the tree's expected error (round zero's 2% reused).
    (At n = 3,000 the screen's floor, 2-point bins around each mass, is below the tree's error there.)"""
    grid = Grid.uniform(0, 100, 12)
    prefix = dpcdf.prefix_counts(np.rint(np.random.default_rng(3).normal(50, 3, 6000)), grid)  # the data set
    seven, six = AdaptiveMechanism(4096, 1.0, "add-remove", plan_version=7), AdaptiveMechanism(4096, 1.0, "add-remove", plan_version=6)
    fine = np.diff(np.append(0, prefix[seven.fine_ends])).astype(np.float64)
    assert seven.plan_version == 7 and 6000 < seven.whole_limit() and not seven.take_whole(seven.zero_n(fine))
    sevens = [_release(seven, prefix, k) for k in range(12)]
    assert all(r.released.plan.design == "whole" for r in sevens)
    assert all(six.noisy(prefix, lambda ids, scale, k=k: prf_noise(bytes([k, 9]) * 8, ids, scale)).plan.design != "whole"
               for k in range(6))
    whole = TreeMechanism(4096, seven.whole.epsilon, "add-remove")  # the same scales: paired draws
    ours = np.mean([dpcdf.metrics.mse_counts(prefix, r.counts) for r in sevens])
    theirs = np.mean([dpcdf.metrics.mse_counts(prefix, _release(whole, prefix, k).counts) for k in range(12)])
    assert ours < 1.02 * theirs, (ours, theirs)  # round zero's counts merged in: about nothing lost or won
    assert whole.expected_mse() < 1.05 * TreeMechanism(4096, 1.0, "add-remove").expected_mse()  # 2% of eps: 1.04x


@pytest.mark.parametrize("epsilon", [0.1, 1.0])
def test_spread_data_are_not_screened(epsilon):
    """Data with no point mass (uniform on the grid, at a third of the route's n): round zero never
    screens them, whatever its noise (40 draws), so the rounds may still find a histogram."""
    mech = AdaptiveMechanism(4096, epsilon, "add-remove", plan_version=8)
    n = int(mech.whole_limit() / 3)
    fine = np.full(mech.fine_ends.size, n / mech.fine_ends.size)
    noise = [prf_noise(bytes([k]) * 16, np.arange(fine.size), mech.scale_zero) for k in range(40)]
    assert not any(mech.screened(fine + z) for z in noise)
    assert all(not mech.take_whole(mech.zero_n(fine + z)) for z in noise)
    spike = fine.copy()
    spike[7] += n  # half the data on one fine bin: screened (its mass is point mass to every histogram)
    assert all(mech.screened(spike + z) for z in noise[:10])


def test_round_zeros_n_errs_low_by_one_sd_of_its_sum():
    """Version 7's n for the route is the fine counts' sum less one sd of it (a single count's in version 6)."""
    seven, six = AdaptiveMechanism(1024, 0.5, "add-remove", plan_version=7), AdaptiveMechanism(1024, 0.5, "add-remove", plan_version=6)
    counts = np.arange(seven.fine_ends.size, dtype=np.float64)
    sd = math.sqrt(counts.size * dlaplace_variance(seven.scale_zero))
    assert seven.zero_n(counts) == pytest.approx(counts.sum() - sd) and six.zero_n(np.array([500.0])) == 500.0
    assert seven.zero_n(counts, copies=2) == pytest.approx(counts.sum() - math.sqrt(2) * sd)


@pytest.mark.parametrize("relation", ["substitution", "add-remove"])
@pytest.mark.parametrize("size, epsilon", [(256, 0.1), (4096, 0.37), (1024, 3.0)])
def test_version_7_spends_and_scales_as_version_6(relation, size, epsilon):
    """Round zero's partition changes (the fine bins partition the grid: one unit moves one of their
    counts by 1, as it moves the grid's count), nothing else: the same scales and the same exact epsilon."""
    seven, six = AdaptiveMechanism(size, epsilon, relation, plan_version=7), AdaptiveMechanism(size, epsilon, relation, plan_version=6)
    for name in ("scale_zero", "scale_one", "scale_fine", "scale_two", "scale_root", "scale_group", "scale_inner"):
        assert getattr(seven, name) == getattr(six, name), name
    assert seven.exact_epsilon(relation) == six.exact_epsilon(relation) <= epsilon
    want = seven.fine_ends if relation == "add-remove" else np.array([size - 1])
    assert np.array_equal(seven.zero_ends, want) and np.array_equal(six.zero_ends, [size - 1])


@pytest.mark.parametrize("size", [256, 257, 300, 1000, 4095, 5000, 16385])
def test_round_zeros_bins_partition_any_grid(size):
    """Round zero's privacy rests on its bins partitioning the grid (a record moves one count by 1):
    strictly increasing ends, the last the grid's last point, on grids that are not powers of two too."""
    ends = AdaptiveMechanism(size, 1.0, "add-remove", plan_version=8).zero_ends
    assert ends[-1] == size - 1 and ends[0] >= 0 and np.all(np.diff(ends) > 0) and ends.size > 1
    counts = np.diff(np.append(-1, ends))  # each bin's points: every point in exactly one bin
    assert counts.sum() == size


def test_too_small_an_epsilon_under_add_remove_is_a_clear_error_and_auto_takes_the_tree():
    """Review of version 7: round zero's 2% of 3e-5 is below the least share; the mechanism says so
    (not a scale error), and the default release takes the tree."""
    with pytest.raises(dpcdf.ParameterError, match="epsilon >= 5e-05 under add-remove"):
        AdaptiveMechanism(4096, 3e-5, "add-remove", plan_version=8)
    assert min_adaptive_epsilon("add-remove", 8) > 3e-5  # (the default version's least is its own: `test_policy`)
    rel = dpcdf.release_ecdf(np.linspace(0, 1, 50), Grid.uniform(0, 1, 12), 1.5e-5, "auto", "add-remove")
    assert isinstance(rel.mechanism, TreeMechanism)
