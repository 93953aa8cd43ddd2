"""The second phase of a calibration (Hosmer-Lemeshow) release: per-group sums of n, of the labels
and of the probabilities in fixed point, and their noise scales (the paper's Algorithm 2). It lives
here, not in `dpcdf.apps`, because the two-server service encodes reports and noises group sums with
it too."""
from __future__ import annotations

from fractions import Fraction

import numpy as np

from .noise import scale_fraction

FRACTION_BITS = 16


def fixed_point(p) -> np.ndarray:
    """Probabilities as integers in units of 2^-16 (what a report's payload carries)."""
    return np.round(np.asarray(p, dtype=np.float64) * (1 << FRACTION_BITS))


def group_scales(epsilon: float, split: float) -> list[Fraction]:
    """Noise scales of the three per-group vectors (n, O, E in fixed point): a third of the second
    phase's budget each, sensitivity 2 (2^17 for E) under substitution."""
    eps3 = (1 - split) * epsilon / 3
    return [scale_fraction(2, eps3), scale_fraction(2, eps3), scale_fraction(2 << FRACTION_BITS, eps3)]


