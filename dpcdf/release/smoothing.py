"""Risk-selected smoothing of a tree release: post-processing that adapts to the data without an
oracle and without spending budget (`postprocess_with="smooth"`).

A tree release's consistent estimate c (`TreeMechanism.consistent`, least squares) is unbiased,
c = F + C z, with a covariance Sigma = C D C^T that depends on the mechanism only (D: the nodes'
noise variances), never on the data. For a fixed linear smoother S,

    E ||c - S c||^2 = ||(I - S) F||^2 + tr((I - S) Sigma (I - S)^T)        (any zero-mean noise)
    E ||S c - F||^2 = ||(I - S) F||^2 + tr(S Sigma S^T)

so R(S) = ||c - S c||^2 - tr((I - S) Sigma (I - S)^T) + tr(S Sigma S^T) is an unbiased estimate of
S's squared error, computed from the release and the mechanism alone (Stein's unbiased risk
estimate; for a linear S it needs no Gaussian assumption). The family: S_h, the piecewise-linear
interpolation of c between the ends of the tree's level-h nodes (h = 0 is c itself). `smooth`
takes the h of least R. On near-uniform data (the paper's Poisson(3) set) a coarse h removes
most of the noise; on spiky data R keeps h = 0.

Privacy: the choice reads only the released node counts and public mechanism parameters, so the
result has exactly the release's guarantee (post-processing). The traces take O(N x nodes x
levels) once per mechanism (cached), so grids up to MAX_SMOOTH_GRID points.
"""
from __future__ import annotations

import numpy as np

from ..errors import ParameterError
from .mechanisms import TreeMechanism

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


_TRACES: dict[tuple, tuple[np.ndarray, np.ndarray]] = {}


def _traces(mech: TreeMechanism) -> tuple[np.ndarray, np.ndarray]:
    """Per level h, the diagonals of (I - S_h) Sigma (I - S_h)^T and S_h Sigma S_h^T (each (levels, N))
    for one noise copy,
    from the consistent estimate's response to each noised node's unit noise (in column blocks).
    Kept per mechanism (its shape and noise variances are all they depend on)."""
    b, height, size = mech.shape.branching, mech.shape.height, mech.size
    key = (size, b, tuple(mech.variances()), tuple(mech.released_levels()))
    if key in _TRACES:
        return _TRACES[key]
    levels = [mech.level_nodes(lv) for lv in range(height + 1)]
    var = mech.variances()
    noised = [(lv, i) for lv in mech.released_levels() if var[lv] > 0 for i in range(levels[lv])]
    at = [knots(size, b, h) for h in range(height + 1)]
    resid, kept = np.zeros((height + 1, size)), np.zeros((height + 1, size))
    for start in range(0, len(noised), _COLUMNS):
        block = noised[start:start + _COLUMNS]
        nodes = [np.zeros((levels[lv], len(block))) for lv in range(height + 1)]
        for col, (lv, i) in enumerate(block):
            nodes[lv][i, col] = np.sqrt(var[lv])
        response = mech.consistent(nodes)  # (size, columns): C D^(1/2) on these nodes
        for h in range(height + 1):
            smooth = interpolate(response, at[h])
            resid[h] += ((response - smooth) ** 2).sum(axis=1)
            kept[h] += (smooth**2).sum(axis=1)
    if len(_TRACES) >= 32:
        _TRACES.clear()
    _TRACES[key] = resid, kept
    return resid, kept


def risks(mech: TreeMechanism, fitted: np.ndarray, copies: int = 1) -> np.ndarray:
    """(levels, N): R(S_h) split over the grid points (row h sums to the unbiased risk estimate of
    S_h above), for a release whose nodes carry `copies` independent noises."""
    if not isinstance(mech, TreeMechanism):
        raise ParameterError(f"risk-selected smoothing needs a tree release, not the {mech.name} mechanism")
    if mech.size > MAX_SMOOTH_GRID:
        raise ParameterError(f"risk-selected smoothing works on grids of up to {MAX_SMOOTH_GRID} points, got {mech.size}")
    resid, kept = _traces(mech)
    c = np.asarray(fitted, dtype=np.float64)
    b = mech.shape.branching
    observed = np.array([(c - interpolate(c, knots(mech.size, b, h))) ** 2 for h in range(len(resid))])
    return observed - copies * resid + copies * kept


def smooth(mech: TreeMechanism, fitted: np.ndarray, copies: int = 1) -> tuple[np.ndarray, int]:
    """(S_h c, h) for the level h of least estimated risk. Post-processing: the release's guarantee."""
    level = int(np.argmin(risks(mech, fitted, copies).sum(axis=1)))
    return interpolate(np.asarray(fitted, dtype=np.float64), knots(mech.size, mech.shape.branching, level)), level
