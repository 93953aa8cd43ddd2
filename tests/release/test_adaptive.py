"""The two-round adaptive mechanism (`dpcdf/release/adaptive.py`): its accounting, the sensitivity of
its rounds by brute force, that round two's design reads round one only, the noise formulas against
simulation, the designs it picks on flat, skewed and spiky data, and its accuracy against the tree; then
the findings of its adversarial review (below: accounting, noise ids, the round-two check the servers
rely on, the analyst's planning on a lying server's answers)."""
from __future__ import annotations

import tracemalloc
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import dpcdf
from dpcdf import Grid, ParameterError, TreeMechanism, metrics, release_ecdf
from dpcdf.release import adaptive
from dpcdf.release.adaptive import (MIN_ADAPTIVE_GRID, ROUND_ONE_IDS, ROUND_TWO_IDS, RoundTwo, bins_noise,
                                    equal_width_ends)
from dpcdf.release.ecdf import finish_release, secure_node_noise
from dpcdf.release.mechanisms import ROOT_SHARE
from dpcdf.release.noise import dlaplace_variance, prf_noise, secure_noise
from dpcdf.service.task import MAX_QUERY_POINTS, MAX_TREE_SIZE, TaskConfig

KEY = bytes(range(16))
from helpers import adaptive_v5 as AdaptiveMechanism  # these tests pin plan version 5's rules (share rule 2)


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
    one, fine, bins = delta / mech.scale_one, delta / mech.scale_fine, delta / mech.scale_two
    group, inner = delta / mech.scale_group, delta / mech.scale_inner  # plan version 3: a split group's total and its bins
    assert abs(float(group) - mech.group_share * float(bins)) < 2**-19 * delta and group + inner <= Fraction(mech.eps_two)
    bins = max(bins, group + inner)
    root = delta / mech.scale_root if mech.root else 0  # add/remove from eps 0.5: a round-two histogram's count of n
    assert mech.root == (relation == "add-remove" and eps >= adaptive.ROOT_EPSILON)
    assert mech.exact_epsilon(relation) == one + fine + max(bins + root, mech.tree.exact_epsilon(relation))
    assert mech.exact_epsilon(relation) <= Fraction(eps)
    shrink = min(1.0, adaptive.SHARE_EPSILON / eps) if relation == "add-remove" else 1.0  # share rule 2
    assert abs(float(one) - adaptive.ROUND_ONE_SHARE * shrink * eps) < 2**-20 * delta
    assert abs(float(fine) - adaptive.FINE_SHARE * shrink * eps) < 2**-20 * delta
    assert abs(float(root) - adaptive.ROOT_SHARE_TWO * mech.eps_two * mech.root) < 2**-20 * delta
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
    coarse, fine = equal_width_ends(1024, adaptive.ROUND_ONE_BINS), equal_width_ends(1024, adaptive.fine_bins(1024))
    assert asked[0] == (1, tuple(int(e) for e in np.concatenate([coarse, fine])))
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
    assert seen[1][1] == mech.scale_fine and seen[1][0].size == adaptive.fine_bins(2048) == 128
    two = (mech.scale_two, mech.scale_inner, mech.scale_group, *[s for s in mech.tree.scales if s is not None])
    assert all(scale in two for _, scale in seen[2:])
    assert {mech.scale_inner, mech.scale_group} <= {scale for _, scale in seen[2:]}  # spikes: split groups
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
    (spiky_data(), 4096, 1.0, "bins", "pchip"),
])
def test_the_design_each_kind_of_data_gets(data, size, eps, design, fill):
    """Flat data: equal-width bins, linear; skewed: bins at equal mass, PCHIP; spiky: the same, cut
    finely at the spikes (`test_a_spike_is_measured_finely_wherever_it_lies`). The plan is random
    (round one's noise): at least 7 of 10 releases (flat data is taken as flat in 98.8%)."""
    grid = Grid.integers(size)
    mech = AdaptiveMechanism(size, eps)
    prefix = dpcdf.prefix_counts(data, grid)
    plans = [mech.noisy(prefix, secure_node_noise).plan for _ in range(10)]
    assert sum(p.design == design and (design == "tree" or p.fill == fill) for p in plans) >= 7, plans


def test_a_spike_is_measured_finely_wherever_it_lies():
    """Issue 25: 32 round-one bins (128 points on 2^12) cannot see a spike of sd 2 grid points, so a
    plan from them spread it (bins 20 to 60 wide, or the tree); with the fine bins each of five spikes
    at random places (n = 5,000) lies in a round-two bin of at most REFINED_WIDTH points (>= 6 of 8 plans
    at eps 1, measured 40 of 40 over four such data sets: at p = 0.98 fewer by chance ~ 5e-4), while skewed data,
    whose fine bins the coarse shape explains, is not cut (>= 4 of 8; cut in 11% of plans by round one's
    noise, every time without the coarse shape)."""
    rng = np.random.default_rng(0)  # the simulated data only
    centres = rng.choice(np.arange(20, 4076), 5, replace=False)
    vals = np.clip(np.rint(rng.normal(centres[rng.integers(0, 5, 5000)], 2)), 0, 4095).astype(np.int64)
    mech = AdaptiveMechanism(4096, 1.0)
    prefix = dpcdf.prefix_counts(vals, Grid.integers(4096))
    fine = 0
    for _ in range(8):
        plan = mech.noisy(prefix, secure_node_noise).plan
        ends = np.asarray(plan.ends)
        at = np.searchsorted(ends, centres)
        fine += plan.design == "bins" and bool(np.all(ends[at] - np.append(-1, ends)[at] <= adaptive.REFINED_WIDTH))
    assert fine >= 6
    skewed, m = dpcdf.prefix_counts(skewed_data(), Grid.integers(1024)), AdaptiveMechanism(1024, 1.0)
    assert sum(m.refined_ends(m.noisy(skewed, secure_node_noise).round_one) is None for _ in range(8)) >= 4


@pytest.mark.parametrize("relation, rule, mass, width, version", [
    ("add-remove", 2, 280, 8, 3), ("add-remove", 2, 700, 4, 3), ("add-remove", 1, 280, 4, 3), ("substitution", 2, 1000, 4, 3),
    ("add-remove", 2, 1000, 2, 3), ("add-remove", 2, 1000, 4, 2)])
def test_under_add_remove_share_rule_2_cuts_a_light_spike_into_8_point_bins(relation, rule, mass, width, version):
    """Share rule 2 under add/remove: a spike below WIDE_SDS round-two noise sds (280 values at eps 1:
    about 146 sds) is cut into 8-point bins (its mass summed from half the noises), a heavier one
    (700: about 360 sds) into REFINED_WIDTH-point bins as before; rule 1 and substitution keep 4. From
    plan version 3 a spike above GROUPED_NARROW_SDS (1,000 values: about 520 sds) gets 2-point bins
    (its bins' noises no longer add up past it: a split group); version 2 kept 4 there."""
    m = AdaptiveMechanism(4096, 1.0, relation, share_rule=rule, plan_version=version)
    counts = np.zeros(m.bins_one)
    counts[2] = counts[32 + 2 * 8 + 3] = mass  # coarse bin 2, its fourth fine bin: indices 304 to 319
    sds = mass / np.sqrt(m.noise_variance(2))
    assert (sds < adaptive.WIDE_SDS) == (width == 8) and (sds > adaptive.GROUPED_NARROW_SDS) == (mass == 1000 and relation != "substitution")
    refined = set(m.refined_ends(counts).tolist())
    assert {e for e in refined if 303 <= e <= 319} == {303} | set(range(303 + width, 320, width))
    assert refined <= set(m.plan(counts, mass if relation == "substitution" else None).ends)


@pytest.mark.parametrize("mass, design, width", [(1000, "bins", adaptive.REFINED_WIDTH), (10**4, "bins", 2), (10**6, "tree", 0)])
def test_a_spike_is_cut_finely_unless_its_values_crowd_a_2_point_bin(mass, design, width):
    """A spike of `mass` values in one fine bin (round one without noise): cut into REFINED_WIDTH-point
    bins at 1,000 values; into 2-point bins at 10^4 (beyond NARROW_SDS round-two sds: 5 spikes of 6 10^4
    values at eps 0.1 got 37,718 with 4-point bins, 19,253 with 2); at 10^6 (beyond TREE_SDS, where a
    2-point bin's interpolation error grows with the square of its count: 5 spikes of 2 10^5 values on
    2^12 got 4,162 at eps 0.5 that way, the tree 865) the tree."""
    m = AdaptiveMechanism(4096, 1.0)
    counts = np.zeros(m.bins_one)
    counts[2] = counts[32 + 2 * 8 + 3] = mass  # coarse bin 2, its fourth fine bin
    plan = m.plan(counts, mass)
    assert plan.design == design
    if design == "bins":
        ends = np.asarray(plan.ends)
        assert set(range(2 * 128 + 3 * 16 + width - 1, 2 * 128 + 4 * 16, width)) <= set(ends.tolist())
        assert 2 * 128 + 3 * 16 + 2 * width - 2 not in set(ends.tolist()) or width == 2


@pytest.mark.parametrize("relation", ["substitution", "add-remove"])
@pytest.mark.parametrize("bin_, neighbour, cut", [(5, 0.0, True), (0, 0.0, False), (5, 400.0, False)])
def test_mass_round_one_cannot_place_is_cut_at_the_fine_bins(relation, bin_, neighbour, cut):
    """A coarse bin holding 1,000 values between empty ones, spread evenly over its fine bins (so no
    fine bin is a spike: what round one's noise makes of a spike at small epsilon): round two cuts it
    at the fine bins' ends and keeps round one's coarse ends around it (a plan at equal mass of the
    coarse shape spread 5 spikes' mass: 25,899 at eps 0.1 under add/remove, 200 runs, against 6,917).
    Not at the grid's end (the steep side of skewed data), nor between bins that hold mass."""
    m = AdaptiveMechanism(4096, 1.0, relation)
    counts = np.zeros(m.bins_one)
    counts[bin_] = 1000.0
    counts[32 + 8 * bin_: 32 + 8 * bin_ + 8] = 125.0  # 8 fine bins of 16 points per coarse bin of 128
    for side in (bin_ - 1, bin_ + 1) if neighbour else ():  # mass on both sides (one side: a run of two, cut)
        counts[side] = neighbour
        counts[32 + 8 * side: 32 + 8 * side + 8] = neighbour / 8
    assert (m.unplaced(counts, None) is not None) == cut
    if cut:
        assert m.refined_ends(counts) is None
        plan = m.plan(counts, counts[:32].sum())
        ends = set(np.asarray(plan.ends).tolist())
        assert plan.design == "bins" and set(range(128 * bin_ + 15, 128 * (bin_ + 1), 16)) <= ends
        assert set(m.round_one_ends.tolist()) <= ends


def test_mass_round_one_cannot_place_does_not_override_a_plan_of_the_tree():
    """Review of issue 25: 60 spikes in the grid's first half (which plan the tree: more than
    MAX_PLANNED_BINS bins at equal mass) and 400 values alone in coarse bin 25 (unplaced mass): the plan
    stays the tree (cutting bin 25 had made it a 53-bin histogram; on such data at eps 1, 60 runs,
    1,007 against 1,890). Round one without noise; version 1 of the plan (no `unplaced`) agrees, and so
    does version 4 under add/remove, which plans up to 64 bins at equal mass but not where unplaced
    mass and no spike would need more than 32 (its review; under substitution 64 bins with the heavy
    fine bins cut as spikes did better: this data at eps 1, 40 paired runs, 0.96x)."""
    rng = np.random.default_rng(5)  # the simulated data only
    centres = rng.uniform(0, 2048, 60)
    dense = np.clip(np.rint(rng.normal(centres[rng.integers(0, 60, 4000)], 3.0)), 0, 4095)
    vals = np.concatenate([dense, rng.integers(25 * 128, 26 * 128, 400)]).astype(np.int64)
    prefix = dpcdf.prefix_counts(vals, Grid.integers(4096))
    m, before = AdaptiveMechanism(4096, 1.0, plan_version=3), AdaptiveMechanism(4096, 1.0, plan_version=1)
    ends = np.concatenate(m.round_one_parts)
    one = adaptive.part_counts(prefix[ends], ends).astype(np.float64)
    assert m.unplaced(one, m.refined_ends(one)) is not None
    assert m.plan(one, vals.size).design == before.plan(one, vals.size).design == "tree"
    assert AdaptiveMechanism(4096, 1.0, "add-remove").plan(one).design == "tree"
    assert AdaptiveMechanism(4096, 1.0).plan(one, vals.size).design == "bins"


@pytest.mark.parametrize("relation", ["substitution", "add-remove"])
def test_round_one_spends_exactly_its_two_partitions_budgets(relation):
    """Brute force over every neighbour of one-value data sets on 256 points: round one's answer (32
    coarse, then 64 fine counts) moves by at most Delta in L1 within each partition, so DLap(Delta /
    eps_1) and DLap(Delta / eps_fine) lose at most Delta / scale_1 + Delta / scale_fine, and that is
    attained: exactly the round-one term of `exact_epsilon`."""
    m = AdaptiveMechanism(256, 1.0, relation)
    delta = 2 if relation == "substitution" else 1
    ends = np.concatenate(m.round_one_parts)
    vec = adaptive.part_counts(np.tril(np.ones((256, 256), np.int64))[ends], ends).T  # (value, count)
    if relation == "substitution":
        moved = np.abs(vec[:, None, :] - vec[None, :, :])
    else:
        moved = np.abs(vec)[:, None, :]
    l1 = {(int(a), int(b)) for a, b in zip(moved[..., :32].sum(-1).ravel(), moved[..., 32:].sum(-1).ravel())}
    loss = max(a / m.scale_one + b / m.scale_fine for a, b in l1)
    assert loss == delta / m.scale_one + delta / m.scale_fine
    bins = max(delta / m.scale_two, delta / m.scale_group + delta / m.scale_inner)
    assert m.exact_epsilon(relation) == loss + max(bins, m.tree.exact_epsilon(relation)) <= Fraction(1)


def round_two_answers(m, plan) -> np.ndarray:
    """(value, answered count) of every one-value data set on m.size points: round two's exact answers."""
    prefix = np.tril(np.ones((m.size, m.size), np.int64))
    return np.hstack([adaptive.part_counts(prefix[e], e).T[:, s] for e, s in m.round_two_parts(plan)])


@pytest.mark.parametrize("relation", ["substitution", "add-remove"])
def test_round_twos_histogram_split_groups_and_count_of_n_spend_exactly_their_budgets(relation):
    """Brute force over every neighbour of one-value data sets on 256 points, for several plans with and
    without split groups: each answered value moves by |d_i| and carries DLap(scale_i)
    (`round_two_scales`), so the loss is max sum_i |d_i| / scale_i; it equals the histogram's term of
    `exact_epsilon` (Delta / scale_two, or Delta / scale_group + Delta / scale_inner in a split group,
    plus Delta / scale_root under add/remove), within eps_2."""
    m = AdaptiveMechanism(256, 1.0, relation)
    delta = 2 if relation == "substitution" else 1
    assert m.root == (relation == "add-remove") and m.scale_group is not None
    rng = np.random.default_rng(3)  # which partitions: not privacy randomness
    some = np.unique(np.append(rng.choice(256, 40, replace=False), 255))
    plans = [RoundTwo("bins", tuple(m.round_one_ends)), RoundTwo("bins", tuple(range(256))),
             RoundTwo("bins", tuple(some), groups=tuple(sorted(set(some[::5].tolist()) | {255}))),
             RoundTwo("bins", tuple(range(256)), groups=(7, 8, 100, 255))]
    bins = max(delta / m.scale_two, delta / m.scale_group + delta / m.scale_inner)
    root = delta / m.scale_root if m.root else 0
    for plan in plans:
        plan = m.check_plan(plan)
        vec = round_two_answers(m, plan)
        scales = m.round_two_scales(plan)
        moved = np.abs(vec[:, None, :] - vec[None, :, :]) if relation == "substitution" else np.abs(vec)[:, None, :]
        distinct = list(dict.fromkeys(scales))  # each scale's L1 move, exactly: sum_i |d_i| / scale_i
        per = np.stack([moved[..., [t == u for t in scales]].sum(-1).ravel() for u in distinct], axis=1)
        loss = max(sum(int(a) / u for a, u in zip(row, distinct)) for row in set(map(tuple, per.tolist())))
        split = m.layout(plan)[1].any()
        assert loss == (bins if split else delta / m.scale_two) + root <= Fraction(m.eps_two)
    assert m.exact_epsilon(relation) == delta / m.scale_one + delta / m.scale_fine + max(
        bins + root, m.tree.exact_epsilon(relation)) <= Fraction(1)


@pytest.mark.parametrize("eps, one, fine", [(0.1, 0.15, 0.05), (0.5, 0.15, 0.05), (1.0, 0.075, 0.025), (4.0, 0.01875, 0.00625)])
def test_round_ones_shares_shrink_above_share_epsilon_under_add_remove_and_each_epsilon_is_exact(eps, one, fine):
    """Share rule 2 under add/remove: 15% and 5% up to eps 0.5, then both times 0.5 / eps (round one's
    noise stays what it is at 0.5); substitution and rule 1 (tasks made before it) keep 15% and 5%. At
    every epsilon, either relation and rule, the guarantee is the exact sum of the rounded budgets and
    at most epsilon, and rule 2 gives round two at least rule 1's budget."""
    assert adaptive.round_one_shares(eps, "add-remove") == pytest.approx((one, fine), rel=1e-12)
    assert adaptive.round_one_shares(eps, "add-remove", rule=1) == adaptive.round_one_shares(eps, "substitution") == (0.15, 0.05)
    for relation in ("substitution", "add-remove"):
        new, old = AdaptiveMechanism(1024, eps, relation), AdaptiveMechanism(1024, eps, relation, share_rule=1)
        want = (one, fine) if relation == "add-remove" else (0.15, 0.05)
        assert (new.eps_one, new.eps_fine) == pytest.approx((want[0] * eps, want[1] * eps), rel=1e-12)
        assert (old.eps_one, old.eps_fine) == pytest.approx((0.15 * eps, 0.05 * eps), rel=1e-12) and not old.root
        assert new.eps_two >= old.eps_two
        for m in (new, old):
            assert m.exact_epsilon(relation) <= Fraction(eps)
            assert m.exact_epsilon(relation) >= Fraction(eps) - m.rounding()
    with pytest.raises(ParameterError, match="rule"):
        AdaptiveMechanism(1024, 1.0, share_rule=3)


@pytest.mark.parametrize("rule", [1, 2])
def test_mass_round_one_cannot_place_is_found_at_the_same_count_whatever_the_shares(rule):
    """Share rule 2 halves round one's coarse share at eps 1 under add/remove, so `unplaced` asks for half
    as many of its (doubled) noise sds: a coarse bin holding 120 values between empty ones (about 13 sds
    at rule 1, 6 at rule 2; five spikes of 100 values were planned away, 2.1x, before this) is cut at the
    fine bins under either rule, and 60 values (below rule 1's 8 sds) under neither."""
    m = AdaptiveMechanism(4096, 1.0, "add-remove", share_rule=rule)
    assert m.isolated_sds == adaptive.ISOLATED_SDS * (0.5 if rule == 2 else 1.0)
    k = m.fine_ends.size // 32  # fine bins per coarse bin
    for mass, cut in ((120, True), (60, False)):
        counts = np.zeros(m.bins_one)
        counts[5], counts[32 + 5 * k: 32 + 6 * k] = mass, mass / k  # mass in one coarse bin, no fine bin a spike
        found = m.unplaced(counts, None)
        assert (found is not None and set(m.fine_ends[5 * k: 6 * k].tolist()) <= set(found.tolist())) == cut, (mass, rule)


def test_a_task_pins_its_shares_rule_and_an_older_config_keeps_rule_1():
    """A new adaptive task pins `adaptive_shares` 2 (its JSON says so); a config written before it (no
    field) keeps rule 1: the same JSON and fingerprint, and round one's and round two's noise scales of
    before, so a server upgraded mid-task answers as before. Other mechanisms leave the field out."""
    config = TaskConfig(**{**BASE, "relation": "add-remove", "epsilon": 1.0, "adaptive_plan": 5})  # version 6 adds round zero
    assert config.adaptive_shares == 2 and '"adaptive_shares":2' in config.to_json()
    old_json = config.to_json().replace('"adaptive_shares":2,', "")
    old = TaskConfig.from_json(old_json)
    assert old.adaptive_shares == 1 and old.to_json() == old_json and old.fingerprint != config.fingerprint
    new_mech, old_mech = config.make_mechanism(), old.make_mechanism()
    before = AdaptiveMechanism(new_mech.size, 1.0, "add-remove", share_rule=1)
    assert (old_mech.scale_one, old_mech.scale_fine, old_mech.scale_two) == (before.scale_one, before.scale_fine, before.scale_two)
    assert new_mech.root and not old_mech.root and new_mech.scale_one != old_mech.scale_one
    tree = TaskConfig(**{**BASE, "mechanism": "tree", "adaptive_shares": 2})
    assert tree.adaptive_shares == 1 and "adaptive_shares" not in tree.to_json()
    with pytest.raises(ParameterError, match="rule"):
        TaskConfig(**{**BASE, "adaptive_shares": 5})


@pytest.mark.parametrize("data", [paper_data, skewed_data])
def test_share_rule_2_is_more_accurate_at_eps_1_under_add_remove(data):
    """Releases at eps 1 under add/remove, PRF noise from fixed keys (deterministic, never flaky): rule 2
    (shares shrunk, round two's count of n) against rule 1. Over 200 paired runs (docs/accuracy.md) its
    mean counts MSE was 0.77x on the paper's data and 0.75x on the skewed data; here 0.67x and 0.63x.
    Asserted: below 0.9x. A 60-run mean of these heavy-tailed errors moves by about 13%, so the
    bound checks the direction, with about two sds of the ratio to spare, not the size."""
    values, grid = data(), Grid.integers(1024)
    prefix = dpcdf.prefix_counts(values, grid)
    mse = {}
    for rule in (1, 2):
        m = AdaptiveMechanism(1024, 1.0, "add-remove", share_rule=rule)
        errs = []
        for r in range(60):
            key = r.to_bytes(16, "little")
            rel = finish_release(grid, m, m.noisy(prefix, lambda ids, scale: prf_noise(key, ids, scale)), values.size)
            errs.append(metrics.mse_counts(prefix, rel.counts))
        mse[rule] = float(np.mean(errs))
    assert mse[2] < 0.9 * mse[1], mse


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


def test_the_default_is_adaptive_under_either_relation_on_grids_it_fits():
    values = skewed_data(1024)
    assert dpcdf.release_ecdf(values, Grid.integers(1024), 1.0).mechanism.name == "adaptive"
    assert dpcdf.release_ecdf(values, Grid.integers(1024), 1.0, relation="add-remove").mechanism.name == "adaptive"
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
        v5 = AdaptiveMechanism(1024, 0.5)  # plan version 5's histograms (version 6 takes them only where safe)
        ours = [metrics.mse_counts(prefix, dpcdf.release_ecdf(data, grid, 0.5, v5).counts) for _ in range(30)]
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
    assert isinstance(mech.tree, TreeMechanism) and mech.tree.epsilon == pytest.approx(0.8 * 0.5)


@pytest.mark.parametrize("size,relation", [(256, "substitution"), (300, "substitution"), (1000, "add-remove")])
def test_missed_structure_closed_form_equals_the_sum_over_the_grid(size, relation):
    """`missed_structure` sums squares of functions linear between round one's ends and the bins' in closed
    form (O(bins^2), whatever the grid); the same sums over every grid index, densely."""
    mech = AdaptiveMechanism(size, 0.7, relation)
    rng = np.random.default_rng(size)  # the test's input only
    counts = rng.integers(-50, 400, adaptive.ROUND_ONE_BINS).astype(np.float64)
    n = float(counts.sum() + 17)
    for k in (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96):  # plan version 3's counts too: ends among round one's or not
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


# ==================================================================================================
# Adversarial review of the two-round adaptive mechanism itself (commit bfe4352, `release.adaptive`,
# `release_ecdf`'s "auto"): its privacy accounting, its noise ids, the round-two check the servers rely
# on, and its planning in the analyst on answers a lying server could send.
#
# A test marked `# review finding (fixed):` asserts the correct behaviour; it failed on the code as reviewed
# and passes since the fixes that followed the review.
# (moved from tests/release/test_review_adaptive_central.py)
# ==================================================================================================
SIZES = st.sampled_from([256, 257, 300, 1000, 1024, 4097, 1 << 16, 100_003, 1 << 20])


# --- privacy accounting -------------------------------------------------------------------------
@settings(max_examples=150, deadline=None, derandomize=True)
@given(eps=st.floats(1e-3, 50.0, allow_nan=False), size=SIZES, relation=st.sampled_from(["substitution", "add-remove"]))
def test_exact_epsilon_never_exceeds_epsilon_and_the_split_is_exact(eps, size, relation):
    """Whatever the design, round one's Delta / scale_1 plus the larger round-two guarantee is <= epsilon,
    exactly (rationals); the float split eps_1 + eps_2 is <= epsilon exactly; and the statement is not
    stated above what holds by more than the mechanism's own rounding allowance."""
    m = AdaptiveMechanism(size, eps, relation)
    exact = m.exact_epsilon(relation)
    assert exact <= Fraction(eps)
    assert Fraction(m.eps_one) + Fraction(m.eps_two) <= Fraction(eps)
    assert exact >= Fraction(eps) - m.rounding()
    delta = 2 if relation == "substitution" else 1
    assert delta / m.scale_one <= Fraction(m.eps_one) and delta / m.scale_two <= Fraction(m.eps_two)
    root = delta / m.scale_root if m.root else 0
    assert delta / m.scale_two + root <= Fraction(m.eps_two)
    assert delta / m.scale_group + delta / m.scale_inner + root <= Fraction(m.eps_two)
    assert m.tree.exact_epsilon(relation) <= Fraction(m.eps_two)


def test_a_histogram_of_any_partition_moves_by_at_most_delta_between_neighbours():
    """The per-bin DLap(Delta / eps_r) calibration: for every partition tried and every neighbour pair
    of one-value data sets on 256 points, the bin-count vector moves by <= 2 in L1 (substitution), 1
    (add/remove)."""
    size, rng = 256, np.random.default_rng(0)  # which partitions: not privacy randomness
    parts = [np.arange(size), np.array([size - 1]), AdaptiveMechanism(size, 1.0).round_one_ends]
    parts += [np.unique(np.append(rng.choice(size, k, replace=False), size - 1)) for k in (3, 17, 100)]
    for ends in parts:
        onehot = np.eye(size, dtype=np.int64)
        bins = np.add.reduceat(onehot, np.append(0, ends[:-1] + 1), axis=1)  # (value's leaf, bin)
        sub = np.abs(bins[:, None, :] - bins[None, :, :]).sum(axis=2).max()
        assert sub <= 2 and np.abs(bins).sum(axis=1).max() <= 1


# --- noise ids: the rounds and the tree never share one --------------------------------------------
@pytest.mark.parametrize("size", [256, 1000, 4096, 1 << 16, 1 << 20])
@pytest.mark.parametrize("relation", ["substitution", "add-remove"])
def test_noise_ids_of_round_one_round_two_and_every_tree_node_are_disjoint(size, relation):
    """Every id the servers' PRF is asked for: round one's 32 bins, round two's bins (up to the largest
    query the servers take, MAX_QUERY_POINTS ends), every node of every released tree level: pairwise
    distinct, so no two released values share a noise."""
    m = AdaptiveMechanism(size, 1.0, relation)
    seen: list[np.ndarray] = []
    scales: list[tuple[int, object]] = []  # (first id, scale) of every call

    def record(ids, scale):
        seen.append(np.asarray(ids, np.uint64).copy())
        scales.append((int(seen[-1][0]), scale))
        return np.zeros(np.asarray(ids).size, np.int64)

    for level in m.released_levels():
        m.tree.node_noise(level, np.arange(m.tree.node_bounds(level)[0].size), record)
    tree = np.concatenate(seen) if seen else np.zeros(0, np.uint64)
    seen.clear()
    m.bin_noise(1, m.bins_one, record)
    one = np.concatenate(seen)
    seen.clear()
    m.bin_noise(2, min(size, MAX_QUERY_POINTS), record)
    two = np.concatenate(seen)  # under add/remove the count of n too
    everything = np.concatenate([tree, one, two])
    assert np.unique(everything).size == everything.size
    assert one.min() == ROUND_ONE_IDS and two.min() == ROUND_TWO_IDS
    assert tree.size == 0 or not ((tree >= ROUND_ONE_IDS) & (tree < ROUND_TWO_IDS + np.uint64(1 << 20))).any()
    # each id at its round's scale: the coarse bins, the fine ones, round two's bins, and (add/remove,
    # share rule 2) the count of n, the last id, at its own scale; no id without noise
    k = min(size, MAX_QUERY_POINTS)
    want = {ROUND_ONE_IDS: m.scale_one, ROUND_ONE_IDS + 32: m.scale_fine, ROUND_TWO_IDS: m.scale_two}
    if m.root:
        want[ROUND_TWO_IDS + k - 1] = m.scale_root  # k counts in all: k - 1 bins, then n
    got = {first: scale for first, scale in scales if ROUND_ONE_IDS <= first < ROUND_TWO_IDS + (1 << 20)}
    assert got == want and all(s is not None and s > 0 for s in got.values())
    assert m.root == (relation == "add-remove") and two.size == k


# --- the round-two check the servers rely on --------------------------------------------------------
@settings(max_examples=300, deadline=None, derandomize=True)
@given(ends=st.lists(st.integers(-3, 260), max_size=12))
def test_check_plan_accepts_exactly_the_partitions_of_the_grid(ends):
    m = AdaptiveMechanism(256, 1.0)
    partition = bool(ends) and ends[0] >= 0 and ends[-1] == 255 and all(b > a for a, b in zip(ends, ends[1:]))
    if partition:
        assert m.check_plan(RoundTwo("bins", tuple(ends))).ends == tuple(ends)
    else:
        with pytest.raises(ParameterError):
            m.check_plan(RoundTwo("bins", tuple(ends)))


@pytest.mark.parametrize("plan", [RoundTwo("Tree"), RoundTwo("bins", (255,), "cubic"), RoundTwo("nodes"),
                                  RoundTwo("bins", ((0, 255),)), RoundTwo("bins", ((255,),))])
def test_check_plan_refuses_other_designs_and_shapes(plan):
    with pytest.raises(ParameterError):
        AdaptiveMechanism(256, 1.0).check_plan(plan)


@pytest.mark.parametrize("ends", [(255.5,), (3.9, 255.0), (True, 255), ("255",), (None,)])
def test_check_plan_refuses_ends_that_are_not_integers(ends):
    """BUG (low; not reachable over HTTP, where `ends` is StrictInt): `check_plan`, which its docstring
    names the check a server must make, casts with np.asarray(int64), so 255.5 is the end 255, True the
    end 1 and "255" the end 255 (accepted), and None is a bare TypeError."""
    with pytest.raises(ParameterError):
        AdaptiveMechanism(256, 1.0).check_plan(RoundTwo("bins", ends))


@pytest.mark.parametrize("ends", [(2 ** 64,), (2 ** 63, 255), (-(2 ** 70), 255)])
def test_check_plan_refuses_ends_beyond_int64_with_a_parameter_error(ends):
    """Review finding (fixed): np.asarray(ends, int64) raises OverflowError, which the server's router does not catch
    (a 500: tests/service/system/test_adaptive_tasks.py)."""
    with pytest.raises(ParameterError):
        AdaptiveMechanism(256, 1.0).check_plan(RoundTwo("bins", ends))


# --- planning on what a lying server could send ------------------------------------------------------
def _garbage(k=96):
    spike = np.zeros(k)
    spike[3] = spike[40] = 10 ** 9  # a coarse and a fine bin
    alternating = np.zeros(k)
    alternating[1:32:2] = 10 ** 6  # heavy coarse bins between empty ones, fine bins flat: `unplaced` everywhere
    alternating[32:] = np.repeat(alternating[:32] / ((k - 32) // 32), (k - 32) // 32)
    return {"zeros": np.zeros(k), "negative": np.full(k, -10.0 ** 6), "int64 extremes": np.array([2.0 ** 63 - 1] * (k // 2) + [-2.0 ** 63] * (k - k // 2)),
            "huge": np.full(k, 2.0 ** 62), "spike": spike, "alternating": alternating}


@pytest.mark.parametrize("relation", ["substitution", "add-remove"])
@pytest.mark.parametrize("n", [0, -5, 100, 1e30])
def test_plan_on_finite_garbage_gives_an_answerable_design(relation, n):
    """Any finite round one (a lying server's reconstructed int64 values), any n >= 0: a design the
    servers' check accepts, at once; a negative n under substitution is refused (not a count)."""
    for size in (300, 1024):
        _plan_garbage(AdaptiveMechanism(size, 1.0, relation), relation, n)


def _plan_garbage(m, relation, n):
    for name, counts in _garbage(m.bins_one).items():
        for copies in (1, 2):
            if relation == "substitution" and n < 0:
                with pytest.raises(ParameterError):
                    m.plan(counts, n, copies)
                continue
            plan = m.plan(counts, n if relation == "substitution" else None, copies)
            assert m.check_plan(plan) == plan, name


@pytest.mark.parametrize("counts, n", [(np.full(96, np.nan), 10), (np.full(96, np.inf), 10),
                                       (np.r_[np.inf, -np.inf, np.zeros(94)], 10), (np.ones(96), float("nan")),
                                       (np.ones(96), None)])
def test_plan_refuses_non_finite_answers_with_a_parameter_error(counts, n):
    """Review finding (fixed): NaN or infinite round-one counts (or n NaN / None under substitution) end in scipy's bare
    ValueError ('`y` must contain only finite values') or a TypeError, not a ParameterError."""
    with pytest.raises(ParameterError):
        AdaptiveMechanism(256, 1.0).plan(counts, n, 2)


def test_gather_checks_round_twos_length_as_it_checks_round_ones():
    """Review finding (fixed): `gather` refuses a round one of the wrong length (ParameterError) but returns a round two
    with more or fewer bins than its plan; `finish_release` then fails with np.interp's bare ValueError."""
    m = AdaptiveMechanism(256, 1.0)

    def bins_at(round_, ends):
        return np.full(len(ends) + (3 if round_ == 2 else 0), 5.0)

    with pytest.raises(ParameterError):
        m.gather(None, None, None, bins_at, n=32 * 5, copies=2)


def test_round_ones_length_is_checked():
    m = AdaptiveMechanism(256, 1.0)
    with pytest.raises(ParameterError, match="round one"):
        m.gather(None, None, None, lambda r, e: np.zeros(31), n=0)


# --- cost and reach of "auto" --------------------------------------------------------------------------
def test_planning_memory_is_linear_in_the_grid_with_a_small_constant():
    """BUG (medium): on flat data `plan` builds, for each of 8 candidate bin counts, several (size, 32)
    float matrices (`missed_structure`: the same round-one noise basis each time): a peak of ~98 grid
    arrays. That is 1 GB and 15 s in the analyst on the service's 2^20 grids, and for release_ecdf's
    "auto" (adaptive on every grid of >= 256 points, Grid allows 2^24) 3.6 GB and 97 s on 2^22 points
    against the tree's 27 s, ~15 GB on 2^24. A plan should need a few dozen grid arrays at most."""
    size = 1 << 16
    m = AdaptiveMechanism(size, 1.0)
    rng, k = np.random.default_rng(0), adaptive.fine_bins(size)  # flat data's round one, coarse then fine
    counts = np.r_[np.full(32, 100_000 / 32) + rng.laplace(0, 2 / m.eps_one, 32), np.full(k, 100_000 / k) + rng.laplace(0, 2 / m.eps_fine, k)]
    tracemalloc.start()
    try:
        plan = m.plan(counts, 100_000, 2)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert plan.design == "bins"
    assert peak / (8 * size) < 40, f"peak {peak / 2 ** 20:.0f} MiB = {peak / (8 * size):.0f} grid-sized float arrays"


def test_auto_does_not_refuse_an_epsilon_the_tree_takes():
    """BUG (low): "auto" picks the adaptive mechanism on >= 256 points, whose round one spends 0.15 eps;
    below eps ~ 6.7e-6 that is under the noise's MIN_EPSILON of 1e-6, so release_ecdf refuses
    ('epsilon too small: a noise's share of the budget would be 7.5e-07' for the 5e-6 the caller gave) what the tree, the
    previous default, releases; `dpcdf task` (default adaptive) refuses such tasks the same way."""
    vals = np.random.default_rng(0).uniform(0, 1, 500)  # the simulated data only
    grid = Grid.uniform(0, 1, 8)
    assert release_ecdf(vals, grid, 5e-6, mechanism="tree").mechanism.name == "tree"
    release_ecdf(vals, grid, 5e-6)


def test_auto_is_adaptive_on_large_enough_grids_only():
    vals = np.random.default_rng(1).uniform(0, 1, 500)  # the simulated data only
    assert release_ecdf(vals, Grid.uniform(0, 1, 8), 1.0).mechanism.name == "adaptive"
    assert release_ecdf(vals, Grid.uniform(0, 1, 7), 1.0).mechanism.name == "tree"
    assert release_ecdf(vals, Grid.uniform(0, 1, 8), 1.0, relation="add-remove").mechanism.name == "adaptive"
    assert release_ecdf(vals, Grid.uniform(0, 1, 8), 1.0, postprocess_with="sparse").mechanism.name == "tree"
    with pytest.raises(ParameterError):
        release_ecdf(vals, Grid.uniform(0, 1, 8), 1.0, mechanism="adaptive", postprocess_with="smooth")


# --- the task config ------------------------------------------------------------------------------------
BASE = dict(grid={"kind": "uniform", "lo": 0.0, "hi": 1.0, "bits": 8}, epsilon=1.0, mechanism="adaptive",
            relation="substitution", min_batch=0, servers=("http://a", "http://b"), hpke_keys=("00", "01"),
            token_hash="0" * 64)


@pytest.mark.parametrize("bad", [
    {"payload": "label"}, {"payload": "calibration"}, {"privacy": "zcdp", "epsilon": None, "rho": 0.5},
    {"grid": {"kind": "uniform", "lo": 0.0, "hi": 1.0, "bits": 21}},
    {"grid": {"kind": "thresholds", "values": [float(v) for v in range(MIN_ADAPTIVE_GRID - 1)]}},
    # (a verified 2^17 grid is a valid config since 09d362a: servers without a Dask cluster refuse it, system/test_dask)
    {"epsilon": 1e-6}, {"epsilon": float("inf")}, {"epsilon": True}])
def test_adaptive_task_configs_refused(bad):
    with pytest.raises(ParameterError):
        TaskConfig(**{**BASE, **bad})


def test_adaptive_task_config_round_trip_and_limits():
    """The largest grid is taken (unverified by default), the smallest verified by default; JSON and
    fingerprint survive a round trip with the same noise scales; a root_share given to an adaptive
    task is not part of it (its tree's root share is ROOT_SHARE, fixed by the mechanism's name)."""
    big = TaskConfig(**{**BASE, "grid": {"kind": "uniform", "lo": 0.0, "hi": 1.0, "bits": 20}})
    assert big.make_grid().size == MAX_TREE_SIZE and big.verify is False
    small = TaskConfig(**BASE)
    assert small.verify is True
    for cfg in (small, big, TaskConfig(**{**BASE, "relation": "add-remove", "root_share": 0.5})):
        again = TaskConfig.from_json(cfg.to_json())
        assert again == cfg and again.fingerprint == cfg.fingerprint
        a, b = cfg.make_mechanism(), again.make_mechanism()
        assert (a.scale_one, a.scale_two, a.tree.scales) == (b.scale_one, b.scale_two, b.tree.scales)
    ar = TaskConfig(**{**BASE, "relation": "add-remove", "root_share": 0.5})
    assert "root_share" not in ar.to_json() and ar.make_mechanism().tree.root_share == ROOT_SHARE


def test_an_unprocessed_add_remove_histogram_uses_the_count_of_n_as_the_estimate_does():
    """postprocess_with="none" (and `quantile(method="bisect")`, which reads the same raw curve) takes
    the least-squares fit of every bin and round two's count of n, whose sum is the release's n: its
    ECDF ends at 1 exactly (it ended anywhere in 0.99 to 1.01 when the raw curve left the count out)."""
    rng = np.random.default_rng(5)
    grid = Grid.integers(1024)
    prefix = dpcdf.prefix_counts(np.clip(np.round(rng.normal(500, 120, 2000)), 0, 1023), grid)
    m = AdaptiveMechanism(1024, 1.0, "add-remove")
    ends = []
    for r in range(30):
        released = m.noisy(prefix, lambda ids, scale: prf_noise(r.to_bytes(16, "little"), ids, scale))
        if released.plan.design == "bins":
            assert released.root is not None
            rel = finish_release(grid, m, released, 0, "none")
            raw = m.estimate(released)[0]
            b, k = float(np.sum(released.round_two)), len(released.round_two)
            v, v_n = dlaplace_variance(m.scale_two), dlaplace_variance(m.scale_root)
            if not released.plan.groups:  # (split groups: `fit`'s weights, tested with them)
                assert raw[-1] == pytest.approx(b + (released.root - b) * k * v / (k * v + v_n), abs=1e-9)
            ends.append(rel.cdf()[-1])
    assert len(ends) > 10 and np.allclose(ends, 1.0, atol=1e-12)


def test_a_split_groups_bins_are_fitted_to_its_total_by_least_squares_unbiased_with_the_stated_variance():
    """Plan version 3 (add/remove below eps 0.5: no count of n): a run of 6 bins whose total is also
    counted. Over 4,000 releases of fixed counts with secure noise at the scales `round_two_scales` states,
    the fit (`AdaptiveMechanism.fit`) is unbiased in every bin, its group total's variance is
    u = 1 / (1 / v_group + 1 / (6 v_in)) within 10%, below the 6 v of the same bins counted once at the
    full budget (version 2), and the bins outside the group are left as answered."""
    m = AdaptiveMechanism(1024, 0.4, "add-remove")
    assert not m.root
    plan = m.check_plan(RoundTwo("bins", (99, 103, 107, 111, 115, 119, 123, 1023), "pchip", (99, 123, 1023)))
    split, member = m.layout(plan)[1:]
    assert split.tolist() == [False, True, False] and member.tolist() == [-1, 0, 0, 0, 0, 0, 0, -1]
    truth = np.array([0, 40, 300, 500, 200, 30, 5, 0], np.int64)
    scales = m.round_two_scales(plan)
    runs, fitted = 4000, []
    for _ in range(runs):
        noisy = truth.tolist() + [int(truth[1:7].sum())]
        noisy = np.array([c + int(secure_noise(1, t)[0]) for c, t in zip(noisy, scales)], np.float64)
        release = adaptive.AdaptiveRelease(np.zeros(m.bins_one), plan, noisy[:8], None, noisy[8:])
        fitted.append(m.fit(release)[0])
        assert fitted[-1][0] == noisy[0] and fitted[-1][7] == noisy[7]
    fitted = np.array(fitted)
    v_in, v_group, v = (dlaplace_variance(t) for t in (m.scale_inner, m.scale_group, m.scale_two))
    sd_mean = np.sqrt(v_in / runs)
    assert np.all(np.abs(fitted.mean(axis=0) - truth) < 4 * sd_mean)
    u = 1 / (1 / v_group + 1 / (6 * v_in))
    assert abs(fitted[:, 1:7].sum(axis=1).var() / u - 1) < 0.1 and u < 0.7 * 6 * v


def test_split_groups_given_wrongly_get_a_parameter_error():
    """Review finding (fixed): `check_plan` raised a bare TypeError for groups=None (BinsQuery's "no groups")
    or a number, and `fit` an IndexError for a release missing its groups' totals."""
    m = AdaptiveMechanism(1024, 1.0)
    assert m.check_plan(RoundTwo("bins", (99, 1023), groups=None)).groups == ()
    with pytest.raises(ParameterError, match="groups"):
        m.check_plan(RoundTwo("bins", (99, 1023), groups=5))
    plan = m.check_plan(RoundTwo("bins", (99, 103, 1023), "pchip", (99, 1023)))
    for groups in (None, np.zeros(2)):
        with pytest.raises(ParameterError, match="split groups"):
            m.counts(adaptive.AdaptiveRelease(np.zeros(m.bins_one), plan, np.array([5.0, 9.0, 100.0]), None, groups), 200)


def test_under_substitution_every_bin_shares_the_excess_of_n_unless_taken_as_empty():
    """postprocess_with="monotone" (no empty test): the excess of n over the bins' sum is shared by every
    bin, one counted exactly 0 too, as the linear estimate and the band share it (before split groups a
    bin of exactly 0 got none: [0, 43.3, 76.7, 100]; review of the change)."""
    m = AdaptiveMechanism(256, 1.0)
    plan = m.check_plan(RoundTwo("bins", (63, 127, 191, 255), "linear"))
    release = adaptive.AdaptiveRelease(np.zeros(m.bins_one), plan, np.array([0.0, 40.0, 30.0, 20.0]))
    counts = m.counts(release, 100, "monotone")[1]
    np.testing.assert_allclose(counts[[63, 127, 191, 255]], [2.5, 45.0, 77.5, 100.0])


def test_plan_version_3_chooses_flat_datas_bin_count_among_more_than_powers_of_two():
    """Flat data at n = 5,000 on 2^10, eps 1 (round one noiseless here): the expected error is flat near
    its least (16 bins 82.9, 24 bins 82.0, 32 bins 89.8), so version 3 takes 24 bins where version 2's
    powers of two gave 16; the confidence band, which must span a bin's whole rise, narrows with it
    (docs/accuracy.md). A task of version 2 keeps its 16."""
    new, old = AdaptiveMechanism(1024, 1.0), AdaptiveMechanism(1024, 1.0, plan_version=2)
    counts = np.concatenate([np.full(32, 5000 / 32), np.full(new.fine_ends.size, 5000 / new.fine_ends.size)])
    assert len(new.plan(counts, 5000).ends) == 24 and len(old.plan(counts, 5000).ends) == 16
    assert new.plan(counts, 5000).fill == "linear"
