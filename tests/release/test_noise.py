"""The exact discrete Laplace sampler: its distribution, its PRF determinism, its calibration."""
import math
import subprocess
import sys
from fractions import Fraction

import numpy as np
import pytest
from scipy import stats

from dpcdf import ParameterError
from dpcdf.release.noise import dlaplace_variance, prf_key, prf_noise, scale_fraction, secure_noise


# 400,000 draws a scale: the chi-square and variance checks below still see a 10% error in the scale at
# half that size (`test_the_test_would_notice_a_wrong_scale`), and the CSPRNG's bytes (48 words a draw)
# were most of the test suite's time in this module at 10^6
SAMPLES = 400_000


def _pmf(scale: Fraction, support: np.ndarray) -> np.ndarray:
    q = math.exp(-1 / float(scale))
    return (1 - q) / (1 + q) * q ** np.abs(support)


def _chi2_pvalue(samples: np.ndarray, scale: Fraction) -> float:
    """Chi-square goodness of fit against the exact pmf, tails pooled so every cell expects >= 20."""
    n = samples.size
    q = math.exp(-1 / float(scale))
    tail = lambda k: n * q ** (k + 1) / (1 + q)  # noqa: E731  expected count beyond k on one side
    k = 0
    while tail(k + 1) >= 20:
        k += 1
    support = np.arange(-k, k + 1)
    expected = n * _pmf(scale, support)
    tail = (n - expected.sum()) / 2
    observed = np.array([(samples < -k).sum()] + [(samples == v).sum() for v in support] + [(samples > k).sum()])
    exp_all = np.concatenate([[tail], expected, [tail]])
    return float(stats.chisquare(observed, exp_all).pvalue)


@pytest.mark.parametrize("scale", [Fraction(1, 3), Fraction(1, 8), Fraction(1), Fraction(5, 2), Fraction(40)])
def test_secure_noise_matches_the_exact_pmf(scale):
    x = secure_noise(SAMPLES, scale)
    assert _chi2_pvalue(x, scale) > 1e-4
    sq = x.astype(np.float64) ** 2
    standard_error = sq.std() / math.sqrt(x.size)  # of the mean of x^2, the variance (mean 0)
    assert abs(sq.mean() - dlaplace_variance(scale)) < 5 * standard_error


@pytest.mark.parametrize("scale", [Fraction(2), Fraction(11)])
def test_prf_noise_matches_the_exact_pmf(scale):
    x = prf_noise(prf_key(b"s" * 32, "test"), np.arange(SAMPLES, dtype=np.uint64), scale)
    assert _chi2_pvalue(x, scale) > 1e-4


def test_the_test_would_notice_a_wrong_scale():
    x = secure_noise(200_000, Fraction(5, 2))
    assert _chi2_pvalue(x, Fraction(11, 4)) < 1e-6


def test_prf_noise_is_the_same_across_calls_orders_and_processes():
    key = prf_key(b"k" * 16, "task-1/path")
    ids = np.array([5, 1 << 56 | 3, 7, 5], dtype=np.uint64)
    a = prf_noise(key, ids, Fraction(10))
    b = prf_noise(key, ids[::-1].copy(), Fraction(10))[::-1]
    np.testing.assert_array_equal(a, b)
    assert a[0] == a[3]
    code = (
        "import numpy as np; from fractions import Fraction; from dpcdf.release.noise import prf_key, prf_noise;"
        "print([int(v) for v in prf_noise(prf_key(b'k'*16, 'task-1/path'), np.array([5, 1<<56|3, 7, 5], dtype=np.uint64), Fraction(10))])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == str([int(v) for v in a])
    other = prf_noise(prf_key(b"k" * 16, "task-2/path"), ids, Fraction(10))
    assert not np.array_equal(a, other)


def test_scale_rounds_epsilon_down():
    for eps in (1 / 3, 0.1, 1e-6, math.pi):
        s = scale_fraction(7, eps)
        assert float(s) >= 7 / eps * (1 - 1e-15)
    assert scale_fraction(2, 0.5) == 4


@pytest.mark.parametrize("eps", [0, -1, math.nan, math.inf, "1", 1e-7])
def test_bad_epsilon(eps):
    with pytest.raises(ParameterError, match="epsilon"):
        scale_fraction(1, eps)


def test_short_seed_is_refused():
    with pytest.raises(ParameterError, match="16 bytes"):
        prf_key(b"short", "x")
