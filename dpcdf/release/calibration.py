"""The second phase of a calibration (Hosmer-Lemeshow) release: per-group sums of n, of the labels
and of the probabilities in fixed point, and their noise scales (the paper's Algorithm 2). It lives
here, not in `dpcdf.apps`, because the two-server service encodes reports and noises group sums with
it too."""
from __future__ import annotations

from fractions import Fraction

import numpy as np

from .noise import scale_fraction
from .zcdp import calibrate_sigma2

FRACTION_BITS = 16


def fixed_point(p) -> np.ndarray:
    """Probabilities as integers in units of 2^-16 (what a report's payload carries)."""
    return np.round(np.asarray(p, dtype=np.float64) * (1 << FRACTION_BITS))


def group_scales(epsilon: float, split: float, privacy: str = "pure") -> list[Fraction]:
    """The noise of the three per-group vectors (n, O, E in fixed point), a third of the second phase's
    budget each (`epsilon` is the task's budget: epsilon, or rho under privacy="zcdp").

    pure: discrete Laplace scales, L1 sensitivity 2 (2^17 for E) under substitution (one person leaves
    a group and joins one: -1 and +1, or -p and +p' in units of 2^-16): each vector
    (1 - split) epsilon / 3-DP, the three together (1 - split) epsilon-DP.
    zcdp: discrete Gaussian variances (`zcdp.GaussianVariance`), L2 squared sensitivity Delta2 = 2
    (1^2 + 1^2; 2 * 2^32 for E) under substitution: sigma^2 = Delta2 / (2 rho_3), rho_3 = (1 - split)
    rho / 3, rounded up (`zcdp.calibrate_sigma2`), so each vector is at most rho_3-zCDP (CKS 2020,
    Theorem 14) and the three together (1 - split) rho-zCDP."""
    if privacy == "zcdp":
        rho3 = (1 - split) * epsilon / 3
        return [calibrate_sigma2(2, rho3), calibrate_sigma2(2, rho3), calibrate_sigma2(2 << (2 * FRACTION_BITS), rho3)]
    eps3 = (1 - split) * epsilon / 3
    return [scale_fraction(2, eps3), scale_fraction(2, eps3), scale_fraction(2 << FRACTION_BITS, eps3)]


