"""Plan version 9 of the adaptive release (the default): round one is one level of the whole tree at its own
budget (`adaptive_level`), so a release that ends in the tree is the tree mechanism's, value for value, and
a histogram spends epsilon less that level's budget."""
from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest

import dpcdf
from dpcdf import Grid, TreeMechanism
from dpcdf.release import adaptive_level
from dpcdf.release.adaptive import MIN_ADAPTIVE_EPSILON, ROUND_ONE_BINS, AdaptiveMechanism, fine_bins
from dpcdf.release.ecdf import finish_release
from dpcdf.release.noise import prf_noise, secure_noise

RELATIONS = ["substitution", "add-remove"]


def _prf(k: int):
    return lambda ids, scale: prf_noise(bytes([k, 9]) * 8, ids, scale)


@pytest.mark.parametrize("relation", RELATIONS)
@pytest.mark.parametrize("size", [256, 257, 1000, 4096, 16384, 1 << 20])
@pytest.mark.parametrize("epsilon", [MIN_ADAPTIVE_EPSILON, 0.01, 0.37, 1.0, 7.0])
def test_version_9_spends_the_trees_budget_or_the_level_and_a_histogram_at_most_epsilon(size, epsilon, relation):
    """The tree is the tree mechanism at all of epsilon (the same scales), round one its level's scale, and the
    exact guarantee the larger of the tree's and the level's plus round two's histogram (bins, split groups,
    the grid's count), at most epsilon; under add/remove a substitution task has none (its root is exact)."""
    mech, tree = AdaptiveMechanism(size, epsilon, relation), TreeMechanism(size, epsilon, relation)
    assert mech.plan_version == 9 and not mech.routed and mech.whole is None and mech.scale_zero is None
    assert mech.tree.scales == tree.scales and mech.scale_fine == tree.scales[mech.one_level]
    delta = TreeMechanism.level_sensitivity(relation)
    bins = delta / mech.scale_two
    if mech.scale_group is not None:
        bins = max(bins, delta / mech.scale_group + delta / mech.scale_inner)
    root = delta / mech.scale_root if mech.scale_root is not None else 0
    exact = mech.exact_epsilon(relation)
    assert exact == max(tree.exact_epsilon(relation), delta / mech.scale_fine + bins + root) <= Fraction(epsilon)
    if relation == "substitution":
        assert mech.exact_epsilon("add-remove") is None
    else:
        assert mech.exact_epsilon("substitution") <= 2 * Fraction(epsilon)


@pytest.mark.parametrize("size", [256, 257, 300, 1000, 1024, 4096, 5000, 16384, 1 << 16, 1 << 20])
def test_round_ones_level_and_bins_nest_in_the_tree(size):
    """The fine bins are the nodes of one tree level below the root with at least 64 of them (the nearest to
    `fine_bins` in ratio); the 32 coarse bins are runs of consecutive ones, as even as the level allows, and
    end at the grid's end; `with_coarse` sums them."""
    mech = AdaptiveMechanism(size, 1.0)
    tree, level = mech.tree, mech.one_level
    assert 0 <= level < tree.shape.height and np.array_equal(mech.fine_ends, tree.node_bounds(level)[1])
    assert mech.fine_ends.size >= adaptive_level.MIN_LEVEL_NODES
    others = [lv for lv in range(tree.shape.height) if -(-size // tree.shape.branching**lv) >= adaptive_level.MIN_LEVEL_NODES]
    ratio = [abs(np.log(-(-size // tree.shape.branching**lv) / fine_bins(size))) for lv in others]
    assert abs(np.log(mech.fine_ends.size / fine_bins(size))) == min(ratio)
    coarse = mech.round_one_ends
    assert coarse.size == ROUND_ONE_BINS and coarse[-1] == size - 1 and np.isin(coarse, mech.fine_ends).all()
    per = np.diff(np.append(-1, np.searchsorted(mech.fine_ends, coarse)))
    assert per.max() - per.min() <= 1
    fine = np.random.default_rng(1).integers(-50, 1000, mech.fine_ends.size).astype(np.float64)
    both = adaptive_level.with_coarse(fine, mech.fine_ends, coarse)
    assert np.array_equal(both[ROUND_ONE_BINS:], fine)
    assert np.array_equal(both[:ROUND_ONE_BINS], np.add.reduceat(fine, np.append(0, np.cumsum(per)[:-1])))


@pytest.mark.parametrize("relation", RELATIONS)
@pytest.mark.parametrize("size", [256, 1000, 4096])
def test_a_release_that_ends_in_the_tree_is_the_tree_mechanisms_value_for_value(size, relation):
    """Spread data at n = 200,000 (no histogram could keep them): every release ends in the tree, and with the
    same PRF noise its counts are the tree mechanism's release's exactly, the coarse bins round one's sums."""
    rng = np.random.default_rng(size)  # the data set
    prefix = np.cumsum(rng.multinomial(200_000, np.full(size, 1 / size)))
    grid, mech, tree = Grid.integers(size), AdaptiveMechanism(size, 0.5, relation), TreeMechanism(size, 0.5, relation)
    for k in range(3):
        ours = finish_release(grid, mech, mech.noisy(prefix, _prf(k)), int(prefix[-1]))
        theirs = finish_release(grid, tree, tree.noisy(prefix, _prf(k)), int(prefix[-1]))
        assert ours.released.plan.design == "tree"
        np.testing.assert_array_equal(ours.counts, theirs.counts)
        level = tree.noisy(prefix, _prf(k))[mech.one_level]
        np.testing.assert_array_equal(ours.released.round_one[ROUND_ONE_BINS:], level)


@pytest.mark.parametrize("relation", RELATIONS)
def test_no_noise_is_drawn_twice_for_a_node_whichever_design(relation):
    """Central releases draw fresh CSPRNG noise at each ask: round one's level must not be asked again when the
    release ends in the tree (two independent noises on one count would spend its budget twice). Every id
    drawn, on either design, is drawn once; round one's ids are the level's node ids."""
    rng = np.random.default_rng(7)  # the data sets: spread and large (the tree), spread and small (a histogram in most
    designs = set()  # releases: 1,000 values under substitution, 3,000 at eps 0.3 under add/remove, 20 of 20 releases each)
    small, epsilon = (1000, 1.0) if relation == "substitution" else (3000, 0.3)
    for n in (200_000, small, small, small):
        prefix = np.cumsum(rng.multinomial(n, np.full(1024, 1 / 1024)))
        mech, drawn = AdaptiveMechanism(1024, epsilon, relation), []

        def noise(ids, scale):
            drawn.extend(np.asarray(ids, np.uint64).tolist())
            return secure_noise(np.asarray(ids).size, scale)

        release = mech.noisy(prefix, noise)
        designs.add(release.plan.design)
        assert len(drawn) == len(set(drawn)), release.plan.design
        level_ids = mech.tree.shape.node_id(np.full(mech.fine_ends.size, mech.one_level), np.arange(mech.fine_ends.size))
        assert set(level_ids.tolist()) <= set(drawn)
    assert designs == {"tree", "bins"}


def test_version_9_needs_round_ones_fine_bins():
    with pytest.raises(dpcdf.ParameterError, match="plan version 9"):
        AdaptiveMechanism(1024, 1.0, fine=False)
    assert AdaptiveMechanism(1024, 1.0, fine=False, plan_version=8).bins_one == ROUND_ONE_BINS
