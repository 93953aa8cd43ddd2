"""Noise on the Hosmer-Lemeshow statistic alone: the sensitivity proof's steps by brute force, the
noise-free value against the plain statistic, the noise's distribution and error formula."""
import math
from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

import dpcdf
from helpers import miscalibrated, null_rejections
from dpcdf import ParameterError
from dpcdf.apps.hosmer_lemeshow import exact_hosmer_lemeshow
from dpcdf.apps.hosmer_lemeshow_direct import (STEPS, bounded_statistic, chi2_pdf, default_clip, laplace_p_value, rank_groups,
                                               sensitivity)
from dpcdf.release.noise import dlaplace_variance, scale_fraction

PROBS = st.one_of(st.sampled_from([0.0, 1.0, 0.5, 0.25]), st.floats(0, 1))
RECORD = st.tuples(PROBS, st.integers(0, 1))


@st.composite
def neighbours(draw):
    """A data set, a substitution of one record, and a number of groups."""
    records = draw(st.lists(RECORD, min_size=3, max_size=30))
    i = draw(st.integers(0, len(records) - 1))
    other = list(records)
    other[i] = draw(RECORD)
    groups = draw(st.integers(3, min(len(records), 6)))
    return records, other, groups


def _arrays(records):
    return np.array([r[0] for r in records]), np.array([r[1] for r in records])


def _contents(records, groups):
    p, y = _arrays(records)
    g = rank_groups(p, y, groups)
    return [Counter(r for r, k in zip(records, g) if k == q) for q in range(groups)]


@given(neighbours())
@settings(max_examples=300, deadline=None)
def test_a_substitution_swaps_at_most_one_record_per_group(case):
    """Step 1 of the proof: each group loses <= 1 record and gains <= 1; sum |dE_g| <= 1."""
    records, other, groups = case
    total_de = 0.0
    for before, after in zip(_contents(records, groups), _contents(other, groups)):
        lost, gained = before - after, after - before
        assert sum(lost.values()) <= 1 and sum(gained.values()) <= 1
        d_o = sum(y for _, y in gained.elements()) - sum(y for _, y in lost.elements())
        assert abs(d_o) <= 1
        total_de += abs(sum(p for p, _ in gained.elements()) - sum(p for p, _ in lost.elements()))
    assert total_de <= 1 + 1e-12


@given(neighbours(), st.floats(-3, 3), st.floats(-3, 3))
@settings(max_examples=400, deadline=None)
def test_bounded_statistic_moves_at_most_its_sensitivity(case, log_floor, log_clip):
    records, other, groups = case
    floor, clip = 10**log_floor, 10**log_clip
    h = [bounded_statistic(*_arrays(r), groups, floor, clip) for r in (records, other, other[::-1])]
    assert abs(h[0] - h[1]) <= sensitivity(groups, floor, clip) * (1 + 1e-9)
    assert h[2] == pytest.approx(h[1], rel=1e-12, abs=1e-12)  # a function of the multiset of records


def test_the_bound_is_nearly_reached():
    """An adversarial data set: groups of 4 with p = 0.5 (E = 2 = floor) and labels 0111 / 1000 in
    turn, so that shifting every group by one rank pushes each group's term from 1 to the cap 4.
    Every substitution by every (p, y) on a grid: the largest change, 3 per group, stays under the
    bound (4 per group) and reaches 3/4 of it."""
    groups, floor, clip = 10, 2.0, 4.0
    y = np.array([v for g in range(groups) for v in ((0, 1, 1, 1) if g % 2 == 0 else (1, 0, 0, 0))])
    p = 0.5 + 1e-6 * np.arange(y.size)
    base = bounded_statistic(p, y, groups, floor, clip)
    worst = 0.0
    for i in range(p.size):
        for q in np.linspace(0, 1, 41):
            for label in (0, 1):
                p2, y2 = p.copy(), y.copy()
                p2[i], y2[i] = q, label
                worst = max(worst, abs(bounded_statistic(p2, y2, groups, floor, clip) - base))
    bound = sensitivity(groups, floor, clip)
    assert 0.74 * bound <= worst <= bound


def test_the_cap_branch_is_reached():
    """A data set and substitution (found by differential evolution) where every one of 3 groups
    moves by the whole cap: the branch groups * C of the bound is exact."""
    p = np.array([0.5868, 0.7802, 0.5691, 0.1342, 0.2267, 0.5099, 0.2963, 0.3343, 0.3054, 0.6112, 0.3337])
    y = np.array([0, 1, 0, 0, 0, 1, 0, 1, 0, 0, 1])
    floor, clip = 0.19272488760858028, 1.263054629129985
    p2, y2 = p.copy(), y.copy()
    p2[6], y2[6] = 0.6086, 1
    change = abs(bounded_statistic(p2, y2, 3, floor, clip) - bounded_statistic(p, y, 3, floor, clip))
    assert sensitivity(3, floor, clip) == pytest.approx(3 * clip, rel=1e-8)
    assert 0.9999 * 3 * clip <= change <= sensitivity(3, floor, clip)


def test_the_expected_count_term_is_needed():
    """Groups of 200 sitting at the cap's edge, alternating the sign of d, each shifted by one rank so
    that |d| grows to the edge: the change exceeds groups * a (so the + b of the bound is needed) and
    reaches 0.97 of the bound."""
    groups, size, edge, floor = 10, 200, 50, 1e4
    clip = 2 * edge**2 / floor
    lows = [0.0, 1e-6] + [0.6 + 0.01 * (g - 2) for g in range(2, groups)]
    p_new, ps, ys = 0.9, [], []
    for g in range(groups):
        sign = 1 if g % 2 == 0 else -1
        shift = sign - ((lows[g + 1] if g + 1 < groups else p_new) - lows[g])  # d's change when the group shifts
        if g == 0:
            base = 1e-9 * np.arange(size)
        elif g == 1:
            base = np.concatenate([[lows[1]], np.linspace(0.3, 0.55, size - 1)])
        else:
            base = lows[g] + 0.001 + 0.006 * np.arange(size) / size
            base[0] = lows[g]
        target = sign * (edge - abs(shift))
        o = int(round(base.sum() + target))
        if g > 0:
            base[1:] += (o - target - base.sum()) / (size - 1)
        label = np.zeros(size, int)
        label[0] = 0 if sign == 1 else 1
        if o - label[0] > 0:
            label[size - (o - label[0]):] = 1
        ps.append(base)
        ys.append(label)
    p, y = np.concatenate(ps), np.concatenate(ys)
    p2, y2 = p.copy(), y.copy()
    p2[0], y2[0] = p_new, 0  # the lowest record leaves, a new one comes in above all
    change = abs(bounded_statistic(p2, y2, groups, floor, clip) - bounded_statistic(p, y, groups, floor, clip))
    bound = sensitivity(groups, floor, clip)
    assert change > groups * 2 * np.sqrt(2 * clip / floor)
    assert 0.97 * bound <= change <= bound


@given(st.lists(st.floats(0.01, 0.99), min_size=12, max_size=80, unique=True), st.integers(3, 6), st.data())
@settings(max_examples=60, deadline=None)
def test_without_floor_and_cap_it_is_the_plain_statistic(p, groups, data):
    """With the smallest floor and the largest cap, H_mC is H over the exact rank groups (checked with
    `exact_hosmer_lemeshow` given the boundaries between the groups)."""
    p = np.array(p)
    y = np.array(data.draw(st.lists(st.integers(0, 1), min_size=p.size, max_size=p.size)))
    s = np.sort(p)
    starts = -(-np.arange(1, groups) * p.size // groups)  # ceil(g n / groups): the groups' first ranks
    edges = np.concatenate([[0.0], s[starts - 1], [1.0]])
    plain = exact_hosmer_lemeshow(p, y, edges)
    assert bounded_statistic(p, y, groups, 1e-3, 1e9) == pytest.approx(plain, rel=1e-9)  # E >= 0.04 here


def _zero(ids, scale):
    return np.zeros(np.asarray(ids).size, np.int64)


def test_noise_free_release_is_the_bounded_statistic_rounded():
    rng = np.random.default_rng(2)  # the test's data only
    p = rng.beta(2, 2, 3000)
    y = (rng.random(3000) < p).astype(int)
    r = dpcdf.hosmer_lemeshow_direct(p, y, 1.0, noise=_zero)
    exact = bounded_statistic(p, y)
    assert abs(r.statistic - exact) <= r.sensitivity / (STEPS - 2)
    assert r.clip == default_clip(10) and r.floor == 5.0
    assert r.sensitivity == sensitivity(10, 5.0, default_clip(10))
    assert "1-DP under substitution" in r.statement
    assert r.p_value == pytest.approx(stats.chi2.sf(r.statistic, 8)) and 0 < r.noise_aware_p_value <= 1


def test_noise_distribution_and_error_formula():
    """The released value minus the bounded statistic, in rounding steps, is DLap(STEPS / epsilon):
    its variance and its CDF at a few points match within 5 standard errors."""
    rng = np.random.default_rng(3)  # the test's data only
    p = rng.beta(2, 2, 2000)
    y = (rng.random(2000) < 1 - p).astype(int)  # miscalibrated: H far from 0 and from the cap
    eps, runs, floor, clip = 2.0, 2000, 100.0, 300.0
    r0 = dpcdf.hosmer_lemeshow_direct(p, y, eps, floor=floor, clip=clip, noise=_zero)
    step = r0.sensitivity / (STEPS - 2)
    h = bounded_statistic(p, y, 10, floor, clip)
    assert 15 * r0.sensitivity / eps < h < 10 * clip - 15 * r0.sensitivity / eps  # the clamps never bite
    noise = np.array([round((dpcdf.hosmer_lemeshow_direct(p, y, eps, floor=floor, clip=clip).statistic - r0.statistic) / step)
                      for _ in range(runs)])
    t = float(scale_fraction(STEPS, eps))
    var = dlaplace_variance(t)
    sq = noise.astype(float) ** 2
    assert abs(sq.mean() - var) < 5 * sq.std() / np.sqrt(runs)
    q = np.exp(-1 / t)
    for k in (0.5 * t, t, 3 * t):
        k = int(k)
        expected = 1 - 2 * q ** (k + 1) / (1 + q)  # P(|X| <= k) for DLap
        got = np.mean(np.abs(noise) <= k)
        assert abs(got - expected) < 5 * np.sqrt(expected * (1 - expected) / runs)
    # the error formula in the statistic's units: MSE = step^2 Var, i.e. about 2 (sensitivity / eps)^2
    assert var * step**2 == pytest.approx(2 * (r0.sensitivity / eps) ** 2, rel=0.01)


def test_error_shrinks_as_epsilon_grows():
    rng = np.random.default_rng(4)  # the test's data only
    p = rng.beta(2, 2, 20000)
    y = (rng.random(20000) < p).astype(int)
    exact = bounded_statistic(p, y, floor=100.0)
    err = {eps: np.mean([(dpcdf.hosmer_lemeshow_direct(p, y, eps, floor=100.0).statistic - exact) ** 2 for _ in range(30)])
           for eps in (0.5, 20.0)}
    assert err[20.0] < err[0.5] / 10


@pytest.mark.parametrize(
    "kwargs,message",
    [
        ({"floor": 0.0}, "floor"),
        ({"floor": 1e-4}, "floor"),
        ({"floor": 10**400}, "floor"),
        ({"floor": float("nan")}, "floor"),
        ({"floor": True}, "floor"),
        ({"clip": -1.0}, "clip"),
        ({"clip": 1e10}, "clip"),
        ({"clip": float("inf")}, "clip"),
        ({"groups": 2}, "groups"),
        ({"groups": 50}, "one person per group"),
        ({"epsilon": 0.0}, "epsilon"),
    ],
)
def test_bad_parameters(kwargs, message):
    args = {"probabilities": np.linspace(0, 1, 20), "labels": np.arange(20) % 2, "epsilon": 1.0} | kwargs
    with pytest.raises(ParameterError, match=message):
        dpcdf.hosmer_lemeshow_direct(**args)


def test_numpy_integers_and_reals_are_accepted():
    p, y = np.linspace(0, 1, 20), np.arange(20) % 2
    a = dpcdf.hosmer_lemeshow_direct(p, y, 1.0, groups=np.int64(4), floor=np.float32(2.0), noise=_zero)
    b = dpcdf.hosmer_lemeshow_direct(p, y, 1.0, groups=4, floor=2.0, noise=_zero)
    assert a.statistic == b.statistic and a.sensitivity == b.sensitivity


@pytest.mark.parametrize("h,scale", [(0.5, 37.0), (5.0, 1.0), (15.5, 0.01), (15.5, 37.0), (200.0, 37.0), (2000.0, 1000.0)])
def test_laplace_p_value_is_the_tail_of_chi_square_plus_laplace(h, scale):
    rng = np.random.default_rng(6)  # Monte Carlo reference only
    draws = 200_000
    x = rng.chisquare(8, draws) + rng.laplace(0, scale, draws)
    mc = np.mean(x >= h)
    assert abs(laplace_p_value(h, 8, scale) - mc) < 5 * np.sqrt(max(mc * (1 - mc), 1e-6) / draws)


def test_laplace_p_value_tends_to_the_plain_one_without_noise():
    for h in (3.0, 15.5, 30.0):
        assert laplace_p_value(h, 8, 1e-4) == pytest.approx(stats.chi2.sf(h, 8), rel=1e-3, abs=1e-9)
    assert laplace_p_value(0.0, 8, 5.0) == 1.0


def test_under_calibration_the_noise_adds_no_false_rejections():
    """400 calibrated data sets (y ~ Bernoulli(p)) at eps = 1: the noise-aware p-value rejects no more
    often than the plain HL test on the same data (+3 SE), while reading the noisy value as H would
    reject far more often."""
    aware, naive, level = null_rejections(lambda p, y: dpcdf.hosmer_lemeshow_direct(p, y, 1.0, floor=20.0),
                                          lambda p, y, r: bounded_statistic(p, y, 10, 1e-3, 1e9), 2000, 400, 8)
    assert aware <= level + 3 * np.sqrt(level * (1 - level) / 400)
    assert naive > 0.3


def test_a_miscalibrated_model_is_still_rejected():
    p, y = miscalibrated(20000, 9)
    r = dpcdf.hosmer_lemeshow_direct(p, y, 5.0, floor=100.0, clip=400.0)
    assert r.noise_aware_p_value < 1e-3 and r.p_value < 1e-3


@given(st.floats(0.0, 200.0), st.integers(1, 40))
def test_the_closed_form_chi2_density_is_scipys(u, dof):
    half = dof / 2
    ours = chi2_pdf(u, half, half * math.log(2) + math.lgamma(half))
    assert ours == pytest.approx(stats.chi2.pdf(u, dof), rel=1e-9, abs=1e-300)
