"""The verification's hot loop (numba): per report, the weighted sums of its grid values that the
check needs (and, for count/label, its top entry), in F_p (p = 2^61 - 1). See `verify.Check.round_one`."""
from __future__ import annotations

import numpy as np
from numba import njit, prange

_P = np.uint64((1 << 61) - 1)
_M31 = np.uint64((1 << 31) - 1)
_M30 = np.uint64((1 << 30) - 1)


@njit(inline="always")
def _fold(x):
    x = (x & _P) + (x >> np.uint64(61))
    return x - _P if x >= _P else x


@njit(inline="always")
def _mul(a, b):
    """a * b mod p from 31-bit halves (as `fss.field.mul`)."""
    a0, a1 = a & _M31, a >> np.uint64(31)
    b0, b1 = b & _M31, b >> np.uint64(31)
    mid = a1 * b0 + a0 * b1
    return _fold((a1 * b1 << np.uint64(1)) + (mid >> np.uint64(30)) + ((mid & _M30) << np.uint64(31)) + a0 * b0)


@njit(parallel=True, cache=True)
def sketch(y, wz, wl, one):
    """y (n, N, w) canonical; wz, wl (N, w): z[k] = sum y[k] * wz, l[k] = sum y[k] * wl, and
    top[k] = one - sum_c y[k, N-1, c] (mod p)."""
    n, size, width = y.shape
    z = np.empty(n, np.uint64)
    l = np.empty(n, np.uint64)
    top = np.empty(n, np.uint64)
    for k in prange(n):
        az = np.uint64(0)
        al = np.uint64(0)
        for i in range(size):
            for c in range(width):
                v = y[k, i, c]
                az = _fold(az + _mul(v, wz[i, c]))
                al = _fold(al + _mul(v, wl[i, c]))
        t = one
        for c in range(width):
            last = y[k, size - 1, c]
            t = t + _P - last if t < last else t - last
        z[k] = az
        l[k] = al
        top[k] = t
    return z, l, top


@njit(cache=True)
def column_sums(y):
    """sum over k of y[k] (N, w), mod p: a server's share of the histogram. Rows are added in
    order (contiguous, vectorized); elements are below 2^61, so four of them fit in a uint64 before
    a fold."""
    n, size, width = y.shape
    m = size * width
    flat = y.reshape(n, m)
    acc = np.zeros(m, np.uint64)
    for k in range(n):
        row = flat[k]
        for j in range(m):
            acc[j] += row[j]
        if k % 4 == 3:
            for j in range(m):
                acc[j] = _fold(acc[j])
    for j in range(m):
        acc[j] = _fold(acc[j])
    return acc.reshape(size, width)



@njit(parallel=True, cache=True)
def sketch_calibration(y, w):
    """The four weighted sums of a calibration report's check (`verify.Check`, payload
    "calibration"): y (n, N, 3) canonical grid values of the components (1, label, q), w (N, 5)
    folded weights (columns: unit/label sketch z on components 0 and 1, its L on components 0 and
    1, the score check's rho). Per report: z = y0.w0 + y1.w1, l = y0.w2 + y1.w3, a = y0.w4 and
    u = y2.w4 (mod p): six multiplications per grid point. Returns (n, 4) columns (z, l, a, u)."""
    n, size, width = y.shape
    res = np.empty((n, 4), np.uint64)
    for k in prange(n):
        z = np.uint64(0)
        l = np.uint64(0)
        a = np.uint64(0)
        u = np.uint64(0)
        for i in range(size):
            y0 = y[k, i, 0]
            y1 = y[k, i, 1]
            z = _fold(z + _mul(y0, w[i, 0]) + _mul(y1, w[i, 1]))  # < 3p before folding
            l = _fold(l + _mul(y0, w[i, 2]) + _mul(y1, w[i, 3]))
            a = _fold(a + _mul(y0, w[i, 4]))
            u = _fold(u + _mul(y[k, i, 2], w[i, 4]))
        res[k, 0] = z
        res[k, 1] = l
        res[k, 2] = a
        res[k, 3] = u
    return res
