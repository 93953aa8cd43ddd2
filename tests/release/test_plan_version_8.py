"""Plan version 8 of the adaptive release (the default): round zero's screen under substitution too.
Round zero counts round one's fine bins with DLap(2 / (0.02 eps)) (a unit that changes bins moves two
counts by 1), the route's n is the public n, and data whose point masses no histogram could keep take
the whole tree at 98% of epsilon. Add/remove is version 7's."""
from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest

import dpcdf
from dpcdf import Grid, TreeMechanism
from dpcdf.release.adaptive import AdaptiveMechanism
from dpcdf.release.adaptive_route import ZERO_SHARE
from dpcdf.release.ecdf import finish_release
from dpcdf.release.noise import prf_noise, scale_fraction


def _prf(k: int):
    return lambda ids, scale: prf_noise(bytes([k, 8]) * 8, ids, scale)


def _release(mech, prefix, k: int):
    return finish_release(Grid.integers(mech.size), mech, mech.noisy(prefix, _prf(k)), int(prefix[-1]))


def test_point_masses_under_substitution_take_the_whole_tree():
    """A normal of sd 1 rounded to integers (about 7 distinct values) on a uniform grid of 2^12 over
    [0, 100], n = 8,000, substitution, eps 1: version 7 runs the rounds, which end in the tree (n is
    below the route's 10,412, and it has no screen under substitution), version 8's round zero sees the point masses and takes the whole tree at
    98% of epsilon, round zero's counts merged in: within 2% of that tree's error, paired draws."""
    grid = Grid.uniform(0, 100, 12)
    prefix = dpcdf.prefix_counts(np.rint(np.random.default_rng(3).normal(50, 1, 8000)), grid)  # the data set
    eight, seven = AdaptiveMechanism(4096, 1.0, plan_version=8), AdaptiveMechanism(4096, 1.0, plan_version=7)
    assert eight.plan_version == 8 and not eight.take_whole(8000) and eight.zero_sensitivity == 2
    eights = [_release(eight, prefix, k) for k in range(12)]
    assert all(r.released.plan.design == "whole" for r in eights)
    assert all(seven.noisy(prefix, _prf(k)).plan.design == "tree" for k in range(4))
    whole = TreeMechanism(4096, eight.whole.epsilon)  # the same scales: paired draws
    ours = np.mean([dpcdf.metrics.mse_counts(prefix, r.counts) for r in eights])
    theirs = np.mean([dpcdf.metrics.mse_counts(prefix, _release(whole, prefix, k).counts) for k in range(12)])
    assert ours < 1.02 * theirs, (ours, theirs)


@pytest.mark.parametrize("epsilon", [0.1, 1.0])
def test_spread_data_under_substitution_are_not_screened(epsilon):
    """Uniform data at a third of the route's n: round zero's noise (40 draws) never screens them; half
    the data on one fine bin is screened."""
    mech = AdaptiveMechanism(4096, epsilon, plan_version=8)
    n = int(mech.whole_limit() / 3)
    fine = np.full(mech.fine_ends.size, n / mech.fine_ends.size)
    noise = [prf_noise(bytes([k]) * 16, np.arange(fine.size), mech.scale_zero) for k in range(40)]
    assert not any(mech.screened(fine + z) for z in noise)
    spike = fine.copy()
    spike[7] += n
    assert all(mech.screened(spike + z) for z in noise[:10])


@pytest.mark.parametrize("size, epsilon", [(256, 0.1), (4096, 0.37), (1024, 3.0)])
def test_version_8_spends_round_zero_under_substitution_and_nothing_new_under_add_remove(size, epsilon):
    """Substitution: round zero's scale is 2 / (0.02 eps) and the routes share the rest (each scale
    version 7's at 98% of epsilon); add/remove: every scale and the exact epsilon are version 7's."""
    eight, seven = AdaptiveMechanism(size, epsilon, plan_version=8), AdaptiveMechanism(size, epsilon, plan_version=7)
    assert seven.scale_zero is None and eight.scale_zero == scale_fraction(2, epsilon * ZERO_SHARE)
    assert np.array_equal(eight.zero_ends, eight.fine_ends) and eight.exact_epsilon("substitution") <= Fraction(epsilon)
    at_rest = AdaptiveMechanism(size, eight.whole.epsilon, plan_version=7)  # version 7 with what round zero leaves
    for name in ("scale_one", "scale_fine", "scale_two", "scale_group", "scale_inner"):
        assert getattr(eight, name) == getattr(at_rest, name), name
    eight, seven = AdaptiveMechanism(size, epsilon, "add-remove", plan_version=8), AdaptiveMechanism(size, epsilon, "add-remove", plan_version=7)
    for name in ("scale_zero", "scale_one", "scale_fine", "scale_two", "scale_root", "scale_group", "scale_inner"):
        assert getattr(eight, name) == getattr(seven, name), name
    assert eight.exact_epsilon("add-remove") == seven.exact_epsilon("add-remove")


def test_round_zeros_counts_move_by_at_most_two_between_substitution_neighbours():
    """Brute force on 2^8: moving one unit from grid point i to j changes round zero's fine counts by
    at most 2 in L1, the sensitivity its scale is set for."""
    mech = AdaptiveMechanism(256, 1.0, plan_version=8)
    of = np.searchsorted(mech.zero_ends, np.arange(256))  # each grid point's fine bin
    i, j = np.meshgrid(np.arange(256), np.arange(256))
    moved = np.where(of[i] == of[j], 0, 2)  # -1 in i's bin, +1 in j's
    assert moved.max() == mech.zero_sensitivity == 2 and mech.zero_epsilon() == Fraction(2) / mech.scale_zero


@pytest.mark.parametrize("n, design", [(300, "rounds"), (200_000, "whole")])
def test_the_route_takes_the_public_n_not_round_zeros_sum(n, design):
    """Under substitution the route's n is n itself (given, or a function giving it), whatever round
    zero's noisy counts sum to; the servers' answers here are all zero but for n."""
    mech = AdaptiveMechanism(1024, 1.0, plan_version=8)
    assert mech.take_whole(200_000) and not mech.take_whole(300)

    def bins_at(round_, ends, groups=()):
        return np.zeros(len(ends) + len(groups))

    nodes = mech.whole.central_nodes(np.zeros(1024, np.int64), _prf(0))
    for given in (n, lambda: n):
        release = mech.gather(None, lambda level, whole=False: nodes(level), None, bins_at, given)
        assert (release.plan.design == "whole") == (design == "whole")


def test_a_substitution_release_without_n_is_refused_before_any_question():
    """Review of version 8: with n unknown (None) under substitution, round zero's noisy sum would route
    the release and round two could not be planned; the release is refused before anything is asked."""
    mech, asked = AdaptiveMechanism(1024, 1.0, plan_version=8), []

    def bins_at(round_, ends, groups=()):
        asked.append(round_)
        return np.zeros(len(ends) + len(groups))

    with pytest.raises(dpcdf.ParameterError, match="asked with n"):
        mech.gather(None, lambda level, whole=False: np.zeros(1), None, bins_at, None)
    assert asked == []


@pytest.mark.parametrize("version", [6, 7, 8])
def test_round_zero_is_counted_at_its_sensitivity_under_either_relation(version):
    """Review of version 8: an add/remove mechanism's epsilon stated under substitution counts round zero
    at the sensitivity there (the fine bins' counts 2, version 6's grid count 0), not at add/remove's 1."""
    for mech in (AdaptiveMechanism(1024, 1.0, "add-remove", plan_version=version), AdaptiveMechanism(1024, 1.0, plan_version=version)):
        if mech.scale_zero is None:
            continue
        fine = mech.zero_ends.size > 1
        assert mech.zero_epsilon("add-remove") == 1 / mech.scale_zero
        assert mech.zero_epsilon("substitution") == (Fraction(2) if fine else Fraction(0)) / mech.scale_zero
        rest = max(mech.tree.exact_epsilon("substitution"), mech.whole.exact_epsilon("substitution"))
        assert mech.exact_epsilon("substitution") >= mech.zero_epsilon("substitution") + rest - Fraction(1, 10**6)
