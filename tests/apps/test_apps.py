"""Applications: ROC/AUC, Hosmer-Lemeshow, histograms, quantile summaries."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sklearn.metrics import roc_auc_score, roc_curve

import dpcdf
from helpers import miscalibrated, null_rejections
from dpcdf import Grid, ParameterError
from dpcdf.apps.hosmer_lemeshow import exact_hosmer_lemeshow, noise_aware_p_value
from dpcdf.release.calibration import group_scales
from dpcdf.apps.roc import l1_area


def zero_noise(ids, scale):
    return np.zeros(np.asarray(ids).size, np.int64)


@given(st.lists(st.tuples(st.integers(0, 15), st.integers(0, 1)), min_size=2, max_size=60))
@settings(max_examples=40, deadline=None)
def test_noise_free_roc_is_scikit_learns(pairs):
    scores = np.array([p[0] for p in pairs], dtype=float)
    labels = np.array([p[1] for p in pairs])
    if labels.min() == labels.max():
        with pytest.raises(ParameterError, match="both classes"):
            dpcdf.roc(scores, labels, Grid.integers(16), 1.0, noise=zero_noise)
        return
    r = dpcdf.roc(scores, labels, Grid.integers(16), 1.0, noise=zero_noise)
    assert r.auc == pytest.approx(roc_auc_score(labels, scores), abs=1e-12)
    fpr, tpr, _ = roc_curve(labels, scores)
    ours = set(zip(np.round(r.fpr, 12), np.round(r.tpr, 12)))
    assert set(zip(np.round(fpr, 12), np.round(tpr, 12))) <= ours


def _calibrated(n, seed):
    rng = np.random.default_rng(seed)  # the test's data only
    p = rng.beta(2, 2, n)
    return p, (rng.random(n) < p).astype(int)


def test_roc_error_shrinks_as_epsilon_grows():
    p, y = _calibrated(3000, 1)
    g = Grid.uniform(0, 1, bits=8)
    exact = dpcdf.roc(p, y, g, 1.0, noise=zero_noise)
    err = {}
    for eps in (0.1, 10.0):
        runs = [dpcdf.roc(p, y, g, eps) for _ in range(8)]
        err[eps] = (np.mean([abs(r.auc - exact.auc) for r in runs]),
                    np.mean([l1_area(r.fpr, r.tpr, exact.fpr, exact.tpr) for r in runs]))
    assert err[10.0][0] < err[0.1][0] and err[10.0][1] < err[0.1][1]
    r = runs[0]
    assert r.positives.mechanism.epsilon_for("add-remove") + r.negatives.mechanism.epsilon_for("add-remove") == pytest.approx(10.0, rel=1e-5)
    assert "10-DP under substitution" in r.statement


def test_noise_free_hosmer_lemeshow_is_the_direct_computation():
    p, y = _calibrated(4000, 2)
    hl = dpcdf.hosmer_lemeshow(p, y, 1.0, noise=zero_noise)
    assert hl.statistic == pytest.approx(exact_hosmer_lemeshow(p, y, hl.boundaries), rel=1e-6)
    # boundaries are the deciles of the probabilities up to the grid's resolution
    np.testing.assert_allclose(hl.boundaries[1:-1], np.quantile(p, np.arange(1, 10) / 10), atol=2 / 1024)
    np.testing.assert_array_equal(hl.counts.sum(), p.size)
    assert hl.dropped == 0 and 0 < hl.p_value <= 1


def test_hosmer_lemeshow_budget_and_error_shrink():
    p, y = _calibrated(4000, 3)
    exact = dpcdf.hosmer_lemeshow(p, y, 1.0, noise=zero_noise).statistic
    err = {eps: np.mean([(dpcdf.hosmer_lemeshow(p, y, eps).statistic - exact) ** 2 for _ in range(6)]) for eps in (0.3, 30.0)}
    assert err[30.0] < err[0.3]
    assert "0.5 for the ECDF" in dpcdf.hosmer_lemeshow(p, y, 1.0).statement


def test_noise_aware_p_value_keeps_the_level_under_calibration():
    """200 calibrated data sets at eps = 1: the chi-square p-value of the noisy H rejects calibration
    almost always (the noise alone inflates H); the noise-aware p-value rejects no more often than
    the plain HL test on the same data and groups (+3 SE)."""
    aware, naive, level = null_rejections(lambda p, y: dpcdf.hosmer_lemeshow(p, y, 1.0),
                                          lambda p, y, hl: exact_hosmer_lemeshow(p, y, hl.boundaries), 5000, 200, 12)
    assert aware <= level + 3 * np.sqrt(level * (1 - level) / 200)
    assert naive > 0.5


def test_noise_aware_p_value_still_rejects_a_miscalibrated_model():
    p, y = miscalibrated(20000, 13)
    assert dpcdf.hosmer_lemeshow(p, y, 1.0).noise_aware_p_value < 0.01


def test_noise_aware_p_value_counts_every_servers_noise():
    """Two servers' noise spreads the simulated statistic: the same value is less surprising."""
    n, e = np.full(10, 500.0), np.linspace(50, 450, 10)
    scales = group_scales(1.0, 0.5)
    h = 60.0
    one, two = (noise_aware_p_value(h, n, e, scales, copies=c, draws=20000) for c in (1, 2))
    assert two > one + 0.05


@pytest.mark.parametrize(
    "call,message",
    [
        (lambda: dpcdf.roc([0.1, np.nan], [0, 1], Grid.uniform(0, 1, 4), 1.0), "NaN"),
        (lambda: dpcdf.roc([0.1, 0.2], [0, 2], Grid.uniform(0, 1, 4), 1.0), "0 or 1"),
        (lambda: dpcdf.roc([0.1, 0.2], [1, 1], Grid.uniform(0, 1, 4), 1.0), "both classes"),
        (lambda: dpcdf.roc([0.1], [1, 0], Grid.uniform(0, 1, 4), 1.0), "as many labels"),
        (lambda: dpcdf.hosmer_lemeshow([0.5, 1.5], [0, 1], 1.0), r"\[0, 1\]"),
        (lambda: dpcdf.hosmer_lemeshow([0.5, np.nan], [0, 1], 1.0), r"\[0, 1\]"),
        (lambda: dpcdf.hosmer_lemeshow([0.5, 0.2], [0, 1], 1.0, groups=2), "groups"),
        (lambda: dpcdf.hosmer_lemeshow([0.5, 0.2], [0, 1], 1.0, split=1.0), "split"),
        (lambda: dpcdf.hosmer_lemeshow([0.5, 0.2], [0, 1], 0.0), "epsilon"),
    ],
)
def test_degenerate_inputs(call, message):
    with pytest.raises(ParameterError, match=message):
        call()


def test_empty_groups_are_dropped_and_counted():
    p = np.full(500, 0.999)
    y = np.ones(500, int)
    hl = dpcdf.hosmer_lemeshow(p, y, 1.0, noise=zero_noise)
    assert hl.dropped >= 1 and np.isfinite(hl.statistic)


def test_histogram_and_quantiles_from_the_release():
    rng = np.random.default_rng(4)
    v = rng.integers(0, 64, 2000)
    rel = dpcdf.release_ecdf(v, Grid.integers(64), 1.0, postprocess_with="monotone", noise=zero_noise)
    edges = np.array([-1, 9, 19, 40, 63])
    want = [((v > a) & (v <= b)).sum() for a, b in zip(edges[:-1], edges[1:])]
    np.testing.assert_allclose(rel.histogram(edges), want)
    np.testing.assert_array_equal(dpcdf.quantiles(v, Grid.integers(64), 1.0, [0.5], noise=zero_noise, postprocess_with="monotone"),
                                  np.quantile(v, [0.5], method="inverted_cdf"))
    with pytest.raises(ParameterError, match="increasing"):
        rel.histogram([3, 1])


def test_roc_curves_draw_noise_from_separate_domains():
    """With a deterministic per-node noise function (like the servers' PRF), the two curves must not
    get the same node noise: it would cancel in their difference and reveal the exact difference of
    the positives' and negatives' counts."""
    p, y = _calibrated(500, 14)
    g = Grid.uniform(0, 1, bits=6)

    def keyed(ids, scale):
        return (np.asarray(ids).astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15) >> np.uint64(40)).astype(np.int64)

    r = dpcdf.roc(p, y, g, 1.0, mechanism="path", noise=keyed)
    exact = dpcdf.roc(p, y, g, 1.0, mechanism="path", noise=zero_noise)
    noisy_gap = r.positives.raw - r.negatives.raw
    exact_gap = exact.positives.raw - exact.negatives.raw
    assert not np.allclose(noisy_gap, exact_gap)


@pytest.mark.parametrize("relation_data", ["separated", "overlapping"])
def test_the_roc_band_covers_the_datas_own_curve_at_every_threshold(relation_data):
    """`RocRelease.band`: each curve's simultaneous band at 1 - alpha/2, so the data's own (FPR, TPR)
    lies in its box at every threshold at once at the level (a union bound, so 97.5% or more: 120 runs
    and a floor of 93%), the boxes are ordered and hold the curve's ends (1 and 0) exactly."""
    rng = np.random.default_rng(11)  # the data set
    y = rng.integers(0, 2, 600)
    shift = 0.3 if relation_data == "separated" else 0.05
    s = np.clip(rng.normal(0.4 + shift * y, 0.15), 0, 1)
    grid = Grid.uniform(0, 1, 6)

    def rates(values):
        c = dpcdf.prefix_counts(values, grid)
        return np.concatenate([[1.0], (c[-1] - c) / c[-1]])
    fpr, tpr = rates(s[y == 0]), rates(s[y == 1])
    covered = 0
    for _ in range(120):
        roc = dpcdf.apps.roc.roc(s, y, grid, 1.0)
        f_lo, f_hi, t_lo, t_hi = roc.band(0.95)
        assert np.all(f_lo <= f_hi) and np.all(t_lo <= t_hi) and f_lo[0] == t_hi[0] == 1.0 and f_hi[-1] == t_lo[-1] == 0.0
        covered += bool(np.all((f_lo - 1e-12 <= fpr) & (fpr <= f_hi + 1e-12) & (t_lo - 1e-12 <= tpr) & (tpr <= t_hi + 1e-12)))
    assert covered >= 0.93 * 120, covered  # (at 97.5% coverage, fewer than 112 of 120 has probability below 0.1%)
    with pytest.raises(ParameterError, match="level"):
        roc.band(1.0)
