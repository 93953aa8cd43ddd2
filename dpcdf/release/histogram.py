"""Histograms over a partition of the grid, as the adaptive release measures them (`dpcdf.release.adaptive`):
equal-width and equal-mass bin ends, bin counts from prefix counts, the prefix counts filled in between
the bins' ends (linear or monotone cubic), the exact noise of a cumulated histogram, and graded bin widths."""
from __future__ import annotations

import math

import numpy as np

UNIFORM_SHARE = 0.3  # of an equal-mass design's knots placed at equal width, not equal mass


def part_counts(at_ends: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Bin counts from prefix counts at `ends`, partitions one after another (a new one starts where
    the ends stop increasing): each value less the one before within its partition."""
    at_ends, ends = np.asarray(at_ends), np.asarray(ends)
    out = np.diff(np.concatenate([np.zeros((1,) + at_ends.shape[1:], at_ends.dtype), at_ends]), axis=0)
    starts = np.flatnonzero(np.diff(ends) <= 0) + 1
    out[starts] = at_ends[starts]
    return out


def equal_width_ends(size: int, bins: int) -> np.ndarray:
    """The last grid index of each of `bins` equal-width bins (widths differ by at most one)."""
    return (np.arange(1, bins + 1) * size) // bins - 1


def fill_linear(values: np.ndarray, ends: np.ndarray, size: int) -> np.ndarray:
    """Prefix counts at every grid index, linear between the bins' ends, from 0 before index 0."""
    return np.interp(np.arange(size), np.append(-1, ends), np.append(0.0, values))


def fill_pchip(values: np.ndarray, ends: np.ndarray, size: int) -> np.ndarray:
    """Prefix counts at every grid index by monotone cubic (Fritsch-Carlson) interpolation of the
    bins' ends, from 0 before index 0: non-decreasing when the values are."""
    from scipy.interpolate import PchipInterpolator

    x, y = np.append(-1, ends), np.maximum.accumulate(np.append(0.0, values))
    if x.size < 3:
        return fill_linear(values, ends, size)
    return PchipInterpolator(x, y)(np.arange(size))


FILLS = {"linear": fill_linear, "pchip": fill_pchip}


def bins_noise(ends: np.ndarray, size: int, variance: float, bridge: bool) -> float:
    """Mean noise variance per grid index of a histogram over bins ending at `ends`, each count
    carrying `variance`, cumulated and interpolated linearly; `bridge`: conditioned on a public total
    (the cumulated noise is then a random-walk bridge, j (K - j) / K at bin j's end)."""
    k = ends.size
    j = np.arange(k + 1)
    at = variance * (j * (k - j) / k if bridge else j)  # at each end, the point before index 0 first
    x = np.arange(size)
    b = np.searchsorted(ends, x)
    lo = np.append(-1, ends)[b]
    lam = (x - lo) / (np.append(-1, ends)[b + 1] - lo)
    cov = variance * (b * (k - b - 1) / k if bridge else b)  # between the ends around x
    return float(np.mean((1 - lam) ** 2 * at[b] + lam**2 * at[b + 1] + 2 * lam * (1 - lam) * cov))


def mass_ends(estimate: np.ndarray, total: float, bins: int, uniform: float = UNIFORM_SHARE) -> np.ndarray:
    """Ends of `bins` bins at equal mass of (1 - uniform) estimate / total + uniform x / size: most
    bins where the estimate puts mass, some everywhere (distinct, the last at the grid's end)."""
    size = estimate.size
    g = (1 - uniform) * estimate / max(total, 1.0) + uniform * np.arange(1, size + 1) / size
    ends = np.searchsorted(g, np.arange(1, bins) / bins, side="left")
    return np.unique(np.append(ends[ends < size - 1], size - 1))


def linear_map(x_from: np.ndarray, x_to: np.ndarray) -> np.ndarray:
    """The matrix taking values at the increasing points `x_from` to their linear interpolation at `x_to`
    (points within [x_from[0], x_from[-1]])."""
    lam = np.interp(x_to, x_from, np.arange(x_from.size, dtype=np.float64))
    lo = np.minimum(np.floor(lam).astype(np.int64), x_from.size - 2)
    out = np.zeros((np.size(x_to), x_from.size))
    rows = np.arange(np.size(x_to))
    out[rows, lo] += 1 - (lam - lo)
    out[rows, lo + 1] += lam - lo
    return out


def linear_energy(values: np.ndarray, widths: np.ndarray) -> np.ndarray:
    """Sum over grid indices of the squares of functions linear between knots: `values` (knots x m)
    at the knots, the first at index -1; `widths` the knots' gaps. Per segment of width L from a to b,
    sum_{t=1..L} (a + (b - a) t / L)^2, exactly."""
    a, b = values[:-1], values[1:]
    d, L = b - a, widths[:, None].astype(np.float64)
    return (L * a**2 + a * d * (L + 1) + d**2 * (L + 1) * (2 * L + 1) / (6 * L)).sum(axis=0)


def energy_form(widths: np.ndarray) -> np.ndarray:
    """Q with v' Q v = `linear_energy` of values v at knots whose gaps are `widths` (the first knot at -1)."""
    L = np.asarray(widths, np.float64)
    c = (L + 1) * (2 * L + 1) / (6 * L)
    q = np.zeros((L.size + 1, L.size + 1))
    i = np.arange(L.size)
    np.add.at(q, (i, i), c - 1)
    np.add.at(q, (i + 1, i + 1), c)
    np.add.at(q, (i, i + 1), ((L + 1) - 2 * c) / 2)
    np.add.at(q, (i + 1, i), ((L + 1) - 2 * c) / 2)
    return q


def graded_ends(ends: np.ndarray, ratio: float) -> np.ndarray:
    """`ends` with each bin more than `ratio` times as wide as its neighbour cut into pieces growing by
    `ratio` away from it (left to right, then right to left; the last piece of a cut bin takes the
    rest, so it is at most 2 `ratio` times its neighbour). Bins at equal mass of an estimate that
    cannot see a tail (round one's noise hides its few values) end in one wide bin spreading the tail
    over the empty grid beyond it; graded widths keep the tail's bins near the mass."""
    out = np.asarray(ends, np.int64)
    for _ in range(2):
        widths = np.diff(np.append(-1, out)).tolist()
        graded = [widths[0]]
        for w in widths[1:]:
            while w >= 2 * math.ceil(ratio * graded[-1]):
                piece = math.ceil(ratio * graded[-1])
                graded.append(piece)
                w -= piece
            graded.append(w)
        out = np.cumsum(graded[::-1]) - 1  # mirrored: the second pass grades from the right
    return out.astype(np.int64)
