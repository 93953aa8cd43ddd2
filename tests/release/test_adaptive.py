"""The two-round adaptive mechanism (`dpcdf/release/adaptive.py`): its accounting, the sensitivity of
its rounds by brute force, that round two's design reads round one only, the noise formulas against
simulation, the designs it picks on flat, skewed and spiky data, and its accuracy against the tree."""
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import dpcdf
from dpcdf import Grid, ParameterError, TreeMechanism, metrics
from dpcdf.release import adaptive
from dpcdf.release.adaptive import AdaptiveMechanism, RoundTwo, bins_noise, equal_width_ends
from dpcdf.release.ecdf import finish_release, secure_node_noise
from dpcdf.release.noise import dlaplace_variance, prf_noise, secure_noise

KEY = bytes(range(16))


def prf(ids, scale):
    return prf_noise(KEY, ids, scale)


def paper_data(size=1024, seed=7):
    return np.repeat(np.arange(size), np.random.default_rng(seed).poisson(3, size))  # the data only


def skewed_data(size=1024, n=3000, seed=7):
    return np.minimum(np.random.default_rng(seed).exponential(25, n).astype(np.int64), size - 1)


def spiky_data(size=4096, n=10_000, seed=7):
    rng = np.random.default_rng(seed)
    centres = np.array([300, 310, 1800, 2600, 3900])
    return np.clip(np.rint(rng.normal(centres[rng.integers(0, 5, n)], 2)), 0, size - 1).astype(np.int64)


@pytest.mark.parametrize("relation", ["substitution", "add-remove"])
@pytest.mark.parametrize("size,eps", [(256, 0.1), (1024, 1.0), (4096, 0.37), (1000, 3.0)])
def test_the_rounds_spend_at_most_epsilon_whichever_design(size, eps, relation):
    mech = AdaptiveMechanism(size, eps, relation)
    delta = 2 if relation == "substitution" else 1
    one, bins = delta / mech.scale_one, delta / mech.scale_two
    assert mech.exact_epsilon(relation) == one + max(bins, mech.tree.exact_epsilon(relation))
    assert mech.exact_epsilon(relation) <= Fraction(eps)
    assert abs(float(one) - adaptive.ROUND_ONE_SHARE * eps) < 2**-20 * delta
    assert mech.stated_epsilon() == eps and relation in mech.statement() and "adaptive" in mech.statement()


def test_no_add_remove_guarantee_when_calibrated_for_substitution():
    mech = AdaptiveMechanism(1024, 1.0, "substitution")
    assert mech.epsilon_for("add-remove") == np.inf and "no DP guarantee" in mech.statement("add-remove")
    assert AdaptiveMechanism(1024, 1.0, "add-remove").epsilon_for("substitution") <= 2.0


@settings(max_examples=40, deadline=None)
@given(st.integers(2, 300), st.data())
def test_a_partitions_counts_move_by_the_stated_sensitivity(size, data):
    """Brute force over every neighbour on a grid: one value substituted moves a partition's count
    vector by at most 2 in L1, one value added or removed by exactly 1 (the scale DLap(Delta / eps)
    assumes that), for any partition a plan may choose."""
    cuts = data.draw(st.lists(st.integers(0, size - 2), unique=True, max_size=size - 1))
    ends = np.array(sorted(cuts) + [size - 1])
    which = np.searchsorted(ends, np.arange(size))  # bin of each grid index
    moved = (which[:, None] != which[None, :]).astype(int) * 2  # substitution i -> j
    assert moved.max() <= 2 and (size == 1 or ends.size == 1 or moved.max() == 2)
    assert np.all(np.bincount(which, minlength=ends.size).sum() == size)  # each index in exactly one bin: add/remove moves 1


def test_round_two_reads_round_one_only():
    """The design is a function of round one's answers (and public n): the same round one gives the
    same plan whatever the data; gather asks round one's fixed bins first, then one round-two design."""
    mech = AdaptiveMechanism(1024, 0.5)
    asked = []

    def bins_at(round_, ends):
        asked.append((round_, tuple(int(e) for e in ends)))
        return np.full(len(ends), 3000 / len(ends)) if round_ == 1 else np.zeros(len(ends))

    release = mech.gather(None, lambda level: pytest.fail("a flat round one plans bins"), None, bins_at, 3000)
    assert asked[0] == (1, tuple(int(e) for e in equal_width_ends(1024, adaptive.ROUND_ONE_BINS)))
    assert [a[0] for a in asked] == [1, 2] and release.plan.design == "bins" and release.plan.fill == "linear"
    assert mech.plan(release.round_one, 3000) == release.plan
    with pytest.raises(ParameterError):
        mech.gather(None, None)


def test_the_central_release_uses_each_rounds_scale_and_fresh_ids():
    mech = AdaptiveMechanism(2048, 0.8)
    seen = []

    def noise(ids, scale):
        seen.append((np.asarray(ids).copy(), scale))
        return np.zeros(np.asarray(ids).size, np.int64)

    values = spiky_data(2048)
    mech.noisy(dpcdf.prefix_counts(values, Grid.integers(2048)), noise)
    assert seen[0][1] == mech.scale_one and seen[0][0].size == adaptive.ROUND_ONE_BINS
    assert all(scale in (mech.scale_two, *[s for s in mech.tree.scales if s is not None]) for _, scale in seen[1:])
    ids = np.concatenate([i.astype(np.uint64) for i, _ in seen])
    assert np.unique(ids).size == ids.size  # no noise reused across rounds or nodes


@pytest.mark.parametrize("bridge", [True, False])
def test_bins_noise_matches_simulation(bridge):
    """The noise formula the plan minimises: histogram noise, cumulated (conditioned on n when
    `bridge`), interpolated linearly; against 4,000 simulated releases (CSPRNG noise)."""
    size, scale = 300, Fraction(7)
    ends = np.array([19, 50, 51, 120, 200, 299])
    var = dlaplace_variance(scale)
    runs = 4000
    z = secure_noise(runs * ends.size, scale).reshape(runs, ends.size).astype(np.float64)
    if bridge:
        z -= z.mean(axis=1, keepdims=True)
    curves = np.array([adaptive.fill_linear(np.cumsum(r), ends, size) for r in z])
    simulated = float(np.mean(curves**2))
    assert simulated == pytest.approx(bins_noise(ends, size, var, bridge), rel=0.08)


@pytest.mark.parametrize("data,size,eps,design,fill", [
    (paper_data(), 1024, 0.5, "bins", "linear"),
    (skewed_data(), 1024, 0.5, "bins", "pchip"),
    (spiky_data(), 4096, 1.0, "tree", "linear"),
])
def test_the_design_each_kind_of_data_gets(data, size, eps, design, fill):
    """Flat data: equal-width bins, linear; skewed: bins at equal mass, PCHIP; spiky: the tree. The
    plan is random (round one's noise): at least 7 of 10 releases (flat data is taken as flat in 98.8%)."""
    grid = Grid.integers(size)
    mech = AdaptiveMechanism(size, eps)
    prefix = dpcdf.prefix_counts(data, grid)
    plans = [mech.noisy(prefix, secure_node_noise).plan for _ in range(10)]
    assert sum(p.design == design and (design == "tree" or p.fill == fill) for p in plans) >= 7, plans


def test_flat_statistic_is_about_one_on_flat_data_and_far_above_on_skewed():
    mech = AdaptiveMechanism(1024, 0.1)
    flat, skew = [], []
    for data, out in ((paper_data(), flat), (skewed_data(), skew)):
        prefix = dpcdf.prefix_counts(data, Grid.integers(1024))
        for _ in range(200):
            one = mech.noisy(prefix, secure_node_noise).round_one
            out.append(mech.flat_statistic(one, data.size))
    assert 0.85 < np.mean(flat) < 1.15 and np.mean(np.array(flat) < adaptive.FLAT_LIMIT) > 0.95
    assert np.mean(np.array(skew) > adaptive.FLAT_LIMIT) > 0.95


@pytest.mark.parametrize("relation", ["substitution", "add-remove"])
def test_releases_are_monotone_within_zero_and_the_total(relation):
    for data, size in ((paper_data(512), 512), (skewed_data(512), 512), (spiky_data(1024), 1024)):
        grid = Grid.integers(size)
        for eps in (0.05, 1.0):
            rel = dpcdf.release_ecdf(data, grid, eps, "adaptive", relation)
            assert np.all(np.diff(rel.counts) >= 0) and rel.counts[0] >= 0 and rel.counts[-1] <= rel.total
            if relation == "substitution":
                assert rel.total == data.size and rel.counts[-1] == pytest.approx(data.size)
            q = rel.quantile([0.1, 0.5, 0.9])
            assert np.all(np.diff(q) >= 0)


def test_the_default_is_adaptive_under_substitution_on_grids_it_fits():
    values = skewed_data(1024)
    assert dpcdf.release_ecdf(values, Grid.integers(1024), 1.0).mechanism.name == "adaptive"
    assert dpcdf.release_ecdf(values, Grid.integers(1024), 1.0, relation="add-remove").mechanism.name == "tree"
    assert dpcdf.release_ecdf(values % 128, Grid.integers(128), 1.0).mechanism.name == "tree"
    assert dpcdf.release_ecdf(values, Grid.integers(1024), 1.0, postprocess_with="smooth").mechanism.name == "tree"
    with pytest.raises(ParameterError):
        AdaptiveMechanism(128, 1.0)
    with pytest.raises(ParameterError):
        dpcdf.release_ecdf(values, Grid.integers(1024), 1.0, "adaptive", postprocess_with="sparse")


def test_more_accurate_than_the_tree_on_smooth_and_skewed_data():
    """Medians of 30 releases each (the plan's typical case; the means are in docs/accuracy.md): at
    eps 0.5 the adaptive release's counts MSE is a fraction of the tree's on the paper's kind of data
    (measured 100 vs 450) and on skewed data (31 vs 146). The bound 0.75 on the ratio of medians was
    crossed in 1 of 10^4 resamples of 600 measured releases (skewed; paper: never, 0.39 at 10^-4)."""
    for data in (paper_data(), skewed_data()):
        grid = Grid.integers(1024)
        prefix = dpcdf.prefix_counts(data, grid)
        ours = [metrics.mse_counts(prefix, dpcdf.release_ecdf(data, grid, 0.5, "adaptive").counts) for _ in range(30)]
        tree = [metrics.mse_counts(prefix, dpcdf.release_ecdf(data, grid, 0.5, "tree").counts) for _ in range(30)]
        assert np.median(ours) < 0.75 * np.median(tree), (np.median(ours), np.median(tree))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(-5, 1030), min_size=1, max_size=40), st.sampled_from(["bins", "tree", "nodes"]),
       st.sampled_from(["linear", "pchip", "cubic"]))
def test_check_plan_takes_only_partitions_of_the_grid(ends, design, fill):
    mech = AdaptiveMechanism(1024, 1.0)
    ok = design == "tree" or (design == "bins" and fill in ("linear", "pchip") and ends[-1] == 1023 and ends[0] >= 0
                              and all(b > a for a, b in zip(ends, ends[1:])))
    if ok:
        assert mech.check_plan(RoundTwo(design, tuple(ends), fill)).design == design
    else:
        with pytest.raises(ParameterError):
            mech.check_plan(RoundTwo(design, tuple(ends), fill))


def test_a_release_is_reproducible_from_a_prf_and_post_processing_is_free():
    """The same PRF noise gives the same release; 'monotone' and 'none' post-process that release."""
    data = skewed_data()
    grid = Grid.integers(1024)
    mech = AdaptiveMechanism(1024, 0.5)
    prefix = dpcdf.prefix_counts(data, grid)
    a, b = mech.noisy(prefix, prf), mech.noisy(prefix, prf)
    assert a.plan == b.plan and np.array_equal(a.round_two, b.round_two)
    auto = finish_release(grid, mech, a, data.size)
    plain = finish_release(grid, mech, a, data.size, "monotone")
    raw = finish_release(grid, mech, a, data.size, "none")
    assert auto.statement == plain.statement == raw.statement
    assert np.array_equal(raw.counts, raw.raw) and not np.array_equal(auto.counts, plain.counts)
    assert isinstance(mech.tree, TreeMechanism) and mech.tree.epsilon == pytest.approx(0.85 * 0.5)


@pytest.mark.parametrize("size,relation", [(256, "substitution"), (300, "substitution"), (1000, "add-remove")])
def test_missed_structure_closed_form_equals_the_sum_over_the_grid(size, relation):
    """`missed_structure` sums squares of functions linear between round one's ends in closed form
    (O(bins^2), whatever the grid); the same sums over every grid index, densely."""
    mech = AdaptiveMechanism(size, 0.7, relation)
    rng = np.random.default_rng(size)  # the test's input only
    counts = rng.integers(-50, 400, adaptive.ROUND_ONE_BINS).astype(np.float64)
    n = float(counts.sum() + 17)
    for k in (1, 2, 4, 8, 16, 32, 64):
        ends = equal_width_ends(size, k)
        c, cum = counts.copy(), np.tril(np.ones((32, 32)))
        if relation == "substitution":
            c, cum = c + (n - c.sum()) / 32, cum @ (np.eye(32) - 1 / 32)
        one = mech.round_one_ends
        est = adaptive.fill_linear(np.cumsum(c), one, size)
        noise = np.stack([adaptive.fill_linear(col, one, size) for col in cum.T], axis=1)
        miss = est - adaptive.fill_linear(est[ends], ends, size)
        noise_miss = noise - np.stack([adaptive.fill_linear(col, ends, size) for col in noise[ends].T], axis=1)
        dense = max(0.0, (np.sum(miss**2) - mech.noise_variance(1) * np.sum(noise_miss**2)) / size)
        assert mech.missed_structure(counts, n, ends) == pytest.approx(dense, rel=1e-9, abs=1e-6), k
