"""The Hosmer-Lemeshow statistic with noise on the statistic alone: the alternative the paper names at
the end of its section 6.6 (a trusted curator, or general MPC, computes H exactly and adds noise
proportional to the sensitivity of H only), to compare with Algorithm 2 (`hosmer_lemeshow`).

H has no bounded global sensitivity (a term (O - E)^2 / E grows without bound as E -> 0), so the
release is that of a bounded version with two public parameters, a floor m and a cap C:

    H_mC = sum_g min(C, d_g^2 / max(E_g, m) + d_g^2 / max(s_g - E_g, m)),   d_g = O_g - E_g,

groups by exact rank (the person of rank r in the order of (p, y) is in group r * groups // n), s_g the
group's size, O_g its positives, E_g the sum of its probabilities. H_mC = H whenever every expected
count E_g, s_g - E_g is at least m and no group's term exceeds C.

Sensitivity under substitution (n public, so the group sizes are fixed):
1. Replacing one record shifts every group between the old and the new rank by one place: each group
   loses at most one record and gains at most one, so |dO_g| <= 1, and as p is sorted all the dE_g
   have one sign and telescope: sum_g |dE_g| <= 1.
2. Where a term f is below C (u = d^2 / E1', v = d^2 / E0', u + v < C, E' >= m):
   |df/dO| = 2 |d| (1/E1' + 1/E0') <= 2 sqrt(2 C / m) =: a, and |df/dE| <= a + max(u/E1', v/E0')
   <= a + C / m =: b. min(f, C) has slope 0 where f > C, so these bound it along any segment.
3. Hence |H_mC(x) - H_mC(x')| <= sum_g min(C, a |dO_g| + b |dE_g|) <= min(groups C, groups a + b).
`tests/dp/test_hosmer_lemeshow_direct.py` checks 1 and 3 by brute force on small data, and data sets
that reach the bound's two branches (to 0.97 and to 1).
Floating point: floor and clip lie in [1e-3, 1e9] (so 2C/m is a normal float and the bound is accurate
to a few ulps; it is rounded up by 1e-9 relative), and each E_g is a correctly rounded sum (fsum), so the
computed H_mC is within a few ulps of the exact one, far below the rounding step below.
"""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

import numpy as np
from scipy import integrate, stats

from ..errors import ParameterError
from .hosmer_lemeshow import check_inputs
from ..release.mechanisms import check_epsilon
from ..release.noise import scale_fraction
from ..release.ecdf import secure_node_noise

STEPS = 4096  # the sensitivity in rounding steps: H_mC is rounded to sensitivity / (STEPS - 2)
BOUNDS = (1e-3, 1e9)  # the range of floor and clip


@dataclass(frozen=True)
class NoisyHosmerLemeshow:
    statistic: float  # the DP estimate of H_mC, clamped to [0, groups * clip]
    p_value: float  # chi-square(groups - 2) tail at `statistic`, as if it were H
    noise_aware_p_value: float  # P(chi-square(groups - 2) + noise >= statistic): `laplace_p_value`
    sensitivity: float
    floor: float
    clip: float
    statement: str


def default_clip(groups: int) -> float:
    """The cap C: the chi-square(groups - 2) value at p = 0.001, so one group at the cap already
    rejects calibration at the 0.1% level (the cap changes no verdict at that level or above)."""
    return float(stats.chi2.isf(1e-3, groups - 2))


def sensitivity(groups: int, floor: float, clip: float) -> float:
    """The substitution sensitivity of H_mC: min(groups C, groups a + b), a = 2 sqrt(2C/m), b = a + C/m
    (rounded up by 1e-9 relative, far more than the float error for floor and clip in BOUNDS)."""
    a = 2 * math.sqrt(2 * clip / floor)
    return min(groups * clip, groups * a + a + clip / floor) * (1 + 1e-9)


def rank_groups(probabilities: np.ndarray, labels: np.ndarray, groups: int) -> np.ndarray:
    """Each person's group: rank r in the order of (p, y) goes to group r * groups // n (equal records
    are interchangeable, so the groups' contents depend on the data alone)."""
    order = np.lexsort((labels, probabilities))
    group = np.empty(order.size, dtype=np.int64)
    group[order] = np.arange(order.size, dtype=np.int64) * groups // order.size
    return group


def bounded_statistic(probabilities, labels, groups: int = 10, floor: float = 5.0, clip: float | None = None) -> float:
    """H_mC without noise (what the release estimates; H itself as floor -> 0 and clip -> infinity)."""
    p, y = check_inputs(probabilities, labels, groups)
    floor, clip = _check_bounds(floor, default_clip(groups) if clip is None else clip)
    return _bounded(p, y, groups, floor, clip)


def _bounded(p: np.ndarray, y: np.ndarray, groups: int, floor: float, clip: float) -> float:
    order = np.lexsort((y, p))  # the order of rank_groups; group g holds ranks [cuts[g], cuts[g + 1])
    ps, ys = p[order], y[order]
    cuts = -(-np.arange(groups + 1) * p.size // groups)
    s = np.diff(cuts).astype(np.float64)
    e = np.array([math.fsum(ps[a:b]) for a, b in zip(cuts[:-1], cuts[1:])])
    d = np.array([ys[a:b].sum() for a, b in zip(cuts[:-1], cuts[1:])], dtype=np.float64) - e
    terms = d * d / np.maximum(e, floor) + d * d / np.maximum(s - e, floor)
    return float(np.minimum(terms, clip).sum())


def _check_bounds(floor: float, clip: float) -> tuple[float, float]:
    lo, hi = BOUNDS
    for name, v in (("floor", floor), ("clip", clip)):
        if isinstance(v, bool) or not isinstance(v, numbers.Real) or not lo <= v <= hi:
            raise ParameterError(f"{name} must be a number in [{lo:g}, {hi:g}], got {v!r}")
    return float(floor), float(clip)


def chi2_pdf(u: float, half: float, log_norm: float) -> float:
    """The chi-square density with 2 * half degrees of freedom at u, from its closed form (log_norm =
    half * ln 2 + ln Gamma(half)): the integrand of `laplace_p_value`, called a few hundred times per
    release, where scipy.stats' generic pdf cost 0.15 ms a call (93% of a release)."""
    if u <= 0:
        return 0.0 if half > 1 else 0.5 if half == 1 else math.inf
    return math.exp((half - 1) * math.log(u) - u / 2 - log_norm)


def laplace_p_value(statistic: float, dof: int, noise_scale: float) -> float:
    """P(X + L >= statistic) for X ~ chi-square(dof) (H under calibration) and L ~ Laplace(noise_scale)
    (the release's noise, continuous in place of its fine discrete steps): the p-value of a released
    value, so that noise alone does not read as miscalibration. Conservative for H_mC, since H_mC <= H.
    A released 0 (clamped) has p-value 1."""
    if statistic <= 0:
        return 1.0
    half = dof / 2
    log_norm = half * math.log(2) + math.lgamma(half)

    def density(u: float) -> float:
        t = statistic - u  # P(L >= t)
        tail = 0.5 * math.exp(-t / noise_scale) if t >= 0 else 1 - 0.5 * math.exp(t / noise_scale)
        return chi2_pdf(u, half, log_norm) * tail

    below = integrate.quad(density, 0, statistic, limit=200)[0]
    above = integrate.quad(density, statistic, np.inf, limit=200)[0]
    return float(min(max(below + above, 0.0), 1.0))


def hosmer_lemeshow_direct(probabilities, labels, epsilon: float, groups: int = 10, floor: float = 5.0,
                           clip: float | None = None, noise=secure_node_noise) -> NoisyHosmerLemeshow:
    """H_mC (module docstring) plus discrete Laplace noise: epsilon-DP under substitution (n public).
    H_mC is rounded to steps of sensitivity / (STEPS - 2) and gets DLap(STEPS / epsilon) steps (the
    two spare steps absorb the rounding and float error); the clamp to [0, groups C] is post-processing.
    Central mode only: the servers of the two-server protocol cannot compute H without general MPC.
    `noise_aware_p_value` accounts for the noise (`laplace_p_value`): at small epsilon it stays near 1/2
    whatever the data, where `p_value`, reading the noisy value as H, rejects calibration for the noise.
    Raises ParameterError as `hosmer_lemeshow` does, for a floor or clip outside BOUNDS, and for fewer
    people than groups."""
    epsilon = check_epsilon(epsilon)
    p, y = check_inputs(probabilities, labels, groups)
    if p.size < groups:
        raise ParameterError(f"need at least one person per group: {p.size} people, {groups} groups")
    floor, clip = _check_bounds(floor, default_clip(groups) if clip is None else clip)
    delta = sensitivity(groups, floor, clip)
    step = delta / (STEPS - 2)
    rounded = round(_bounded(p, y, groups, floor, clip) / step)
    scale = scale_fraction(STEPS, epsilon)
    noisy = rounded + int(noise(np.zeros(1, dtype=np.uint64), scale)[0])
    h = min(max(noisy * step, 0.0), groups * clip)
    statement = (f"{epsilon:g}-DP under substitution (n public): the whole budget on the bounded statistic "
                 f"(floor {floor:g}, cap {clip:g} per group, sensitivity {delta:.4g})")
    aware = laplace_p_value(h, groups - 2, step * float(scale))
    return NoisyHosmerLemeshow(h, float(stats.chi2.sf(h, groups - 2)), aware, delta, floor, clip, statement)
