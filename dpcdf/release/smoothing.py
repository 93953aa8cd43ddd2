"""Data-adaptive smoothing of a tree release without an oracle or budget: `postprocess_with="smooth"`.

A tree release's consistent estimate c (`TreeMechanism.consistent`, least squares) is unbiased,
c = F + C z, with a covariance Sigma = C D C^T that depends on the mechanism only (D: the nodes'
noise variances), never on the data. Write c as its coarsest interpolation plus details:
c = S_H c + sum_h d_h, d_h = (S_h - S_(h+1)) c, where S_h interpolates c linearly between the ends of
the tree's level-h nodes (S_0 c = c; S_H c is one line through the root). Each detail is noise plus
the data's departure from a straight line inside level-(h+1) nodes. `smooth` keeps, inside each
level-(h+1) node B, the fraction lambda = max(0, 1 - tr(Sigma_dB) / ||d_B||^2) of the detail, where
tr(Sigma_dB) is its exact noise variance: since E ||d_B||^2 = ||mu_B||^2 + tr(Sigma_dB), this is the
positive-part James-Stein estimate of the best scalar ||mu_B||^2 / (||mu_B||^2 + tr(Sigma_dB)): a detail
that is mostly noise (near-uniform data, flat stretches) is dropped, one that is mostly signal (a
spike, the bend of a skewed distribution) is kept. Then the monotone fit, as for every release.

Privacy: it reads only the released node counts and public mechanism parameters, so the result
has exactly the release's guarantee (post-processing). It assumes the noise is there: a release
made without noise (a test server) is shrunk as if it had it. The traces take O(N x nodes x levels)
once per mechanism (cached), so grids up to MAX_SMOOTH_GRID points.
"""
from __future__ import annotations

import numpy as np

from ..errors import ParameterError
from .mechanisms import Mechanism, TreeMechanism

MAX_SMOOTH_GRID = 1 << 12
_COLUMNS = 512  # unit noises propagated through the consistent estimate at a time


def knots(size: int, branching: int, level: int) -> np.ndarray:
    """The last grid index of each level-`level` node (the smoother's interpolation knots)."""
    width = branching**level
    return np.minimum(np.arange(width - 1, size + width - 1, width), size - 1)


def interpolate(c: np.ndarray, at: np.ndarray) -> np.ndarray:
    """S c: c kept at the knots `at` (sorted, ending at len(c) - 1) and linear in between, from
    the point (-1, 0) before the first; c may carry a batch of columns (axis 0 is the grid)."""
    x = np.arange(len(c))
    j = np.searchsorted(at, x)
    hi = at[j]
    lo = np.where(j > 0, at[np.maximum(j - 1, 0)], -1)
    lam = (x - lo) / (hi - lo)
    left = np.where((lo >= 0).reshape(-1, *[1] * (c.ndim - 1)), c[np.maximum(lo, 0)], 0.0)
    lam = lam.reshape(-1, *[1] * (c.ndim - 1))
    return (1 - lam) * left + lam * c[hi]


_TRACES: dict[tuple, np.ndarray] = {}


def detail_variances(mech: TreeMechanism) -> np.ndarray:
    """(levels - 1, N): per grid point, the noise variance of detail d_h = (S_h - S_(h+1)) c for one
    noise copy, from the consistent estimate's response to each noised node's unit noise (in column
    blocks). Kept per mechanism (its shape and noise variances are all it depends on)."""
    b, height, size = mech.shape.branching, mech.shape.height, mech.size
    key = (size, b, tuple(mech.variances()), tuple(mech.released_levels()))
    if key in _TRACES:
        return _TRACES[key]
    levels = [mech.level_nodes(lv) for lv in range(height + 1)]
    var = mech.variances()
    noised = [(lv, i) for lv in mech.released_levels() if var[lv] > 0 for i in range(levels[lv])]
    at = [knots(size, b, h) for h in range(height + 1)]
    out = np.zeros((height, size))
    for start in range(0, len(noised), _COLUMNS):
        block = noised[start:start + _COLUMNS]
        nodes = [np.zeros((levels[lv], len(block))) for lv in range(height + 1)]
        for col, (lv, i) in enumerate(block):
            nodes[lv][i, col] = np.sqrt(var[lv])
        response = mech.consistent(nodes)  # (size, columns): C D^(1/2) on these nodes
        smooth = [interpolate(response, at[h]) for h in range(height + 1)]
        for h in range(height):
            out[h] += ((smooth[h] - smooth[h + 1]) ** 2).sum(axis=1)
    if len(_TRACES) >= 32:
        _TRACES.clear()
    _TRACES[key] = out
    return out


def smooth(mech: Mechanism, fitted: np.ndarray, copies: int = 1) -> np.ndarray:
    """S_H c plus every detail d_h shrunk inside each level-(h+1) node by its James-Stein factor
    (module docstring), for a release whose nodes carry `copies` independent noises."""
    if not isinstance(mech, TreeMechanism):
        raise ParameterError(f"smoothing needs a tree release, not the {mech.name} mechanism")
    if mech.size > MAX_SMOOTH_GRID:
        raise ParameterError(f"smoothing works on grids of up to {MAX_SMOOTH_GRID} points, got {mech.size}")
    b, height, size = mech.shape.branching, mech.shape.height, mech.size
    noise = copies * detail_variances(mech)
    c = np.asarray(fitted, dtype=np.float64)
    levels = [interpolate(c, knots(size, b, h)) for h in range(height + 1)]
    out = levels[height].copy()
    for h in range(height):
        detail = levels[h] - levels[h + 1]
        starts = np.arange(0, size, b ** (h + 1))
        signal = np.add.reduceat(detail**2, starts)
        keep = np.maximum(0.0, 1.0 - np.add.reduceat(noise[h], starts) / np.where(signal > 0, signal, np.inf))
        out += np.repeat(keep, np.diff(np.append(starts, size))) * detail
    return out
