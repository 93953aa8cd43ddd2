"""Error metrics between a true and an estimated CDF on a grid (sarus-dp-cdf-methods: KS,
Wasserstein-1, energy distance; plus the mean squared error of the prefix counts)."""
from __future__ import annotations

import numpy as np


def ks(true_cdf: np.ndarray, est_cdf: np.ndarray) -> float:
    """Kolmogorov-Smirnov distance: max |F - G| over the grid."""
    return float(np.max(np.abs(np.asarray(true_cdf) - np.asarray(est_cdf))))


def wasserstein1(true_cdf: np.ndarray, est_cdf: np.ndarray, thresholds: np.ndarray) -> float:
    """Integral of |F - G| over the grid's range (step functions between thresholds)."""
    gaps = np.diff(np.asarray(thresholds, dtype=np.float64))
    return float(np.sum(np.abs(np.asarray(true_cdf) - np.asarray(est_cdf))[:-1] * gaps))


def energy(true_cdf: np.ndarray, est_cdf: np.ndarray, thresholds: np.ndarray) -> float:
    """Energy distance sqrt(2 * integral of (F - G)^2) (the 1-D identity of Szekely and Rizzo)."""
    gaps = np.diff(np.asarray(thresholds, dtype=np.float64))
    return float(np.sqrt(2 * np.sum(((np.asarray(true_cdf) - np.asarray(est_cdf)) ** 2)[:-1] * gaps)))


def mse_counts(true_counts: np.ndarray, est_counts: np.ndarray) -> float:
    """Mean squared error of prefix counts over the grid."""
    d = np.asarray(true_counts, dtype=np.float64) - np.asarray(est_counts, dtype=np.float64)
    return float(np.mean(d * d))
