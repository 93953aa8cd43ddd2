"""The DP Hosmer-Lemeshow statistic (the paper's section 5.2 and Algorithm 2).

Phase 1 (budget share `split` of epsilon): the ECDF of the predicted probabilities on a grid over
[0, 1]; the group boundaries are its quantiles at q / groups. Phase 2 (the rest): per group, the
number of people n_q, the observed positives O_q = sum y and the expected positives E_q = sum p, each
as a vector over groups with discrete Laplace noise, the probabilities in fixed point (2^-16). With the
boundaries fixed, one person is in one group: a substitution changes each vector in at most two
groups by at most one unit (2^16 for E), so each of the three vectors gets a third of phase 2's budget
with sensitivity 2 (2^17). The whole release (boundaries, n_q, O_q, E_q and H) is epsilon-DP under
substitution (n public). H = sum_q (O_q - E_q)^2 / E_q + (O0_q - E0_q)^2 / E0_q with O0 = n_q - O_q,
E0 = n_q - E_q; its p-value is the chi-square tail with groups - 2 degrees of freedom.
"""
from __future__ import annotations

import numbers
from dataclasses import dataclass
import numpy as np
from scipy import stats

from .errors import ParameterError
from .grid import Grid
from .mechanisms import check_epsilon
from .noise import scale_fraction
from .release import release_ecdf, secure_node_noise

FRACTION_BITS = 16


@dataclass(frozen=True)
class HosmerLemeshow:
    statistic: float
    p_value: float
    boundaries: np.ndarray  # groups + 1 edges, 0 and 1 included
    counts: np.ndarray  # n_q (noisy)
    observed: np.ndarray  # O_q (noisy)
    expected: np.ndarray  # E_q (noisy)
    dropped: int  # groups left out of H because a noisy denominator was not positive
    statement: str


def statistic(counts, observed, expected) -> tuple[float, int]:
    """H from per-group n, O, E; groups whose E or n - E is not positive are left out (and counted)."""
    n, o, e = (np.asarray(a, dtype=np.float64) for a in (counts, observed, expected))
    e0, o0 = n - e, n - o
    ok = (e > 0) & (e0 > 0)
    h = np.sum((o[ok] - e[ok]) ** 2 / e[ok] + (o0[ok] - e0[ok]) ** 2 / e0[ok])
    return float(h), int((~ok).sum())


def hosmer_lemeshow(probabilities, labels, epsilon: float, groups: int = 10, bits: int = 10, split: float = 0.5,
                    noise=secure_node_noise) -> HosmerLemeshow:
    """The epsilon-DP Hosmer-Lemeshow statistic of predicted probabilities against binary labels.
    Raises ParameterError for probabilities outside [0, 1] or NaN, labels other than 0/1, fewer than
    3 groups, or a budget split outside (0, 1)."""
    epsilon = check_epsilon(epsilon)
    p, y = check_inputs(probabilities, labels, groups)
    if not 0 < split < 1:
        raise ParameterError(f"split must lie in (0, 1), got {split!r}")
    grid = Grid.uniform(0.0, 1.0, bits)
    ecdf = release_ecdf(p, grid, split * epsilon, noise=noise)
    inner = ecdf.quantile(np.arange(1, groups) / groups)
    group = np.clip(np.searchsorted(inner, p, side="left"), 0, groups - 1)  # p <= edge q -> group q
    sums = np.stack([np.bincount(group, minlength=groups), np.bincount(group, weights=y, minlength=groups),
                     np.bincount(group, weights=fixed_point(p), minlength=groups)]).astype(np.int64)
    ids = np.arange(groups, dtype=np.uint64)
    noisy = np.stack([sums[k] + noise(ids + np.uint64((k + 1) << 32), scale) for k, scale in enumerate(group_scales(epsilon, split))])
    return from_group_sums(noisy, np.concatenate([[0.0], inner, [1.0]]), epsilon, split)


def check_inputs(probabilities, labels, groups: int) -> tuple[np.ndarray, np.ndarray]:
    """Probabilities and labels as flat arrays, or ParameterError: probabilities outside [0, 1] or
    NaN, labels other than 0/1, lengths that differ, fewer than 3 groups."""
    p = np.asarray(probabilities, dtype=np.float64).reshape(-1)
    y = np.asarray(labels).reshape(-1)
    if p.size == 0 or p.size != y.size:
        raise ParameterError(f"need as many labels as probabilities, and some: got {p.size} and {y.size}")
    if np.isnan(p).any() or (p < 0).any() or (p > 1).any():
        raise ParameterError("probabilities must lie in [0, 1]")
    if not np.isin(y, [0, 1]).all():
        raise ParameterError("labels must be 0 or 1")
    if isinstance(groups, bool) or not isinstance(groups, numbers.Integral) or groups < 3:
        raise ParameterError(f"groups must be an int >= 3 (the test has groups - 2 degrees of freedom), got {groups!r}")
    return p, y.astype(np.int64)


def fixed_point(p) -> np.ndarray:
    """Probabilities as integers in units of 2^-16 (what a report's payload carries)."""
    return np.round(np.asarray(p, dtype=np.float64) * (1 << FRACTION_BITS))


def group_scales(epsilon: float, split: float) -> list:
    """Noise scales of the three per-group vectors (n, O, E in fixed point): a third of the second
    phase's budget each, sensitivity 2 (2^17 for E) under substitution."""
    eps3 = (1 - split) * epsilon / 3
    return [scale_fraction(2, eps3), scale_fraction(2, eps3), scale_fraction(2 << FRACTION_BITS, eps3)]


def from_group_sums(noisy: np.ndarray, edges: np.ndarray, epsilon: float, split: float) -> HosmerLemeshow:
    """The statistic, its p-value and the statement from noisy per-group (n, O, E fixed point) sums."""
    n_hat, o_hat = noisy[0].astype(np.float64), noisy[1].astype(np.float64)
    e_hat = noisy[2] / float(1 << FRACTION_BITS)
    groups = n_hat.size
    h, dropped = statistic(n_hat, o_hat, e_hat)
    dof = max(groups - 2 - dropped, 1)
    statement = (f"{epsilon:g}-DP under substitution (n public): {split * epsilon:g} for the ECDF of the probabilities "
                 f"(group boundaries), {(1 - split) * epsilon / 3:g} each for the group counts, observed and expected positives")
    return HosmerLemeshow(h, float(stats.chi2.sf(h, dof)), edges, n_hat, o_hat, e_hat, dropped, statement)


def exact_hosmer_lemeshow(probabilities, labels, boundaries) -> float:
    """The non-private H for given group boundaries (the reference the tests compare with)."""
    p, y = np.asarray(probabilities, dtype=np.float64), np.asarray(labels, dtype=np.float64)
    inner = np.asarray(boundaries)[1:-1]
    group = np.clip(np.searchsorted(inner, p, side="left"), 0, len(boundaries) - 2)
    g = len(boundaries) - 1
    return statistic(np.bincount(group, minlength=g), np.bincount(group, weights=y, minlength=g),
                     np.bincount(group, weights=p, minlength=g))[0]
