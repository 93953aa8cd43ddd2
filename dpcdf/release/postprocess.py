"""Post-processing of noisy prefix counts: no privacy cost (it only touches released values).

- `monotone`: the closest non-decreasing vector within [lo, hi], in L2 (isotonic regression by
  pool-adjacent-violators, scipy) or L1 (a linear program, scipy's HiGHS).
- `smooth_eq3`: the paper's eq. 3: the smallest node adjustments (sum of |nu|^p, p = 1 or 2) that
  make the released prefixes monotone within [0, n]. p = 1 is an LP (HiGHS), p = 2 a QP (OSQP).
scipy and OSQP are well-kept solvers of exactly these problems; writing our own would only add risk.
They are imported where they are used: a server and the CLI never smooth, and importing scipy costs
them about half a second per process.
"""
from __future__ import annotations

import numpy as np

from ..errors import DpcdfError, ParameterError


def monotone(y: np.ndarray, lo: float = 0.0, hi: float = np.inf, p: int = 2, last: float | None = None) -> np.ndarray:
    """argmin ||x - y||_p over non-decreasing x with lo <= x <= hi (clipping the unconstrained
    isotonic solution is exact for both norms); with `last`, x[-1] = last is imposed (a public
    fact, e.g. F(t_max) = n under substitution with clamping)."""
    y = np.asarray(y, dtype=np.float64)
    if last is not None:
        y = y.copy()
        y[-1] = last
    if p == 2:
        weights = None
        if last is not None:
            weights = np.ones(y.size)
            weights[-1] = 1e12 * y.size  # pools ending at the fixed point take its value
        from scipy.optimize import isotonic_regression

        x = isotonic_regression(y, weights=weights, increasing=True).x
    elif p == 1:
        x = np.maximum.accumulate(_isotonic_l1(y, fixed_last=last is not None))  # exact where the LP is within tolerance
    else:
        raise ParameterError(f"p must be 1 or 2, got {p!r}")
    x = np.clip(x, lo, hi)
    if last is not None:
        x[-1] = last
        x = np.minimum(x, last)
    return x


def _isotonic_l1(y: np.ndarray, fixed_last: bool = False) -> np.ndarray:
    """min sum |x - y| s.t. x non-decreasing (and x[-1] = y[-1] if fixed_last), as an LP in (x, r)
    with r >= |x - y|."""
    import scipy.sparse as sp
    from scipy.optimize import linprog

    n = y.size
    if n == 1:
        return y.copy()
    eye = sp.identity(n, format="csr")
    diff = sp.diags([np.ones(n - 1), -np.ones(n - 1)], [0, 1], shape=(n - 1, n))  # x_i - x_{i+1} <= 0
    a_ub = sp.vstack([sp.hstack([eye, -eye]), sp.hstack([-eye, -eye]), sp.hstack([diff, sp.csr_matrix((n - 1, n))])])
    b_ub = np.concatenate([y, -y, np.zeros(n - 1)])
    c = np.concatenate([np.zeros(n), np.ones(n)])
    bounds = [(None, None)] * n + [(0, None)] * n
    if fixed_last:
        bounds[n - 1] = (y[-1], y[-1])
    res = linprog(c, A_ub=a_ub, b_ub=b_ub, bounds=bounds, method="highs")
    if res.status != 0:
        raise DpcdfError(f"L1 isotonic regression failed: {res.message}")
    return res.x[:n]


def smooth_eq3(noisy: np.ndarray, node_sets: np.ndarray, total: float, p: int = 2) -> np.ndarray:
    """The paper's eq. 3 over the points whose noisy prefixes are `noisy` (sorted by threshold):
    node_sets[k] are the node ids whose noise entered noisy[k]. Finds node adjustments nu minimising
    sum |nu|^p such that noisy + A nu is non-decreasing, >= 0 at the first point and <= total at the
    last; returns noisy + A nu."""
    import scipy.sparse as sp
    from scipy.optimize import linprog

    noisy = np.asarray(noisy, dtype=np.float64)
    m = noisy.size
    unique, inverse = np.unique(node_sets, return_inverse=True)
    rows = np.repeat(np.arange(m), node_sets.shape[1])
    a = sp.csr_matrix((np.ones(rows.size), (rows, inverse.reshape(-1))), shape=(m, unique.size))
    k = unique.size
    diff = sp.diags([np.ones(m - 1), -np.ones(m - 1)], [0, 1], shape=(m - 1, m))
    # constraints on F = noisy + A nu:  F_i - F_{i+1} <= 0,  -F_0 <= 0,  F_last <= total
    first = sp.csr_matrix(([-1.0], ([0], [0])), shape=(1, m))
    last = sp.csr_matrix(([1.0], ([0], [m - 1])), shape=(1, m))
    g = sp.vstack([diff, first, last]).tocsr()
    ga = (g @ a).tocsr()
    bound = -(g @ noisy) + np.concatenate([np.zeros(m - 1), [0.0], [total]])
    if p == 1:
        c = np.ones(2 * k)
        res = linprog(c, A_ub=sp.hstack([ga, -ga]), b_ub=bound, bounds=[(0, None)] * (2 * k), method="highs")
        if res.status != 0:
            raise DpcdfError(f"eq. 3 smoothing (p = 1) failed: {res.message}")
        nu = res.x[:k] - res.x[k:]
    elif p == 2:
        import osqp

        solver = osqp.OSQP()
        solver.setup(P=sp.identity(k, format="csc") * 2.0, q=np.zeros(k), A=ga.tocsc(),
                     l=np.full(bound.size, -np.inf), u=bound, verbose=False, eps_abs=1e-9, eps_rel=1e-9,
                     max_iter=200000, polishing=True)
        res = solver.solve(raise_error=False)
        if res.info.status not in ("solved", "solved inaccurate"):
            raise DpcdfError(f"eq. 3 smoothing (p = 2) failed: {res.info.status}")
        nu = res.x
    else:
        raise ParameterError(f"p must be 1 or 2, got {p!r}")
    out = noisy + a @ nu
    # the solvers meet the constraints up to ~1e-9; make the result exactly monotone and in range
    return np.clip(np.maximum.accumulate(out), 0.0, total)
