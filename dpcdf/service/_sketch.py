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


@njit(inline="always")
def _combine(s11, s01, s00):
    """2^62 s11 + 2^31 s01 + s00 (mod p) for s11, s01, s00 < p (2^62 = 2 mod p)."""
    return _fold(_mul(s11, np.uint64(2)) + _mul(s01, np.uint64(1 << 31)) + s00)


@njit(parallel=True, cache=True)
def sketch(y, wz, wl, one):
    """y (n, N, w) canonical; wz, wl (N, w): z[k] = sum y[k] * wz, l[k] = sum y[k] * wl, and
    top[k] = one - sum_c y[k, N-1, c] (mod p).

    Lazy reduction: with v = 2^31 v1 + v0 and w = 2^31 w1 + w0 (v1, w1 < 2^30; v0, w0 < 2^31),
    sum v w = 2^62 S11 + 2^31 S01 + S00 over the partial products' sums, which stay below 2^64 for
    two grid values between folds (v1 w1 < 2^60, v1 w0 + v0 w1 < 2^62, v0 w0 < 2^62)."""
    n, size, width = y.shape
    m = size * width
    yf = y.reshape(n, m)
    z0, z1 = (wz.reshape(m) & _M31), (wz.reshape(m) >> np.uint64(31))
    l0, l1 = (wl.reshape(m) & _M31), (wl.reshape(m) >> np.uint64(31))
    z = np.empty(n, np.uint64)
    l = np.empty(n, np.uint64)
    top = np.empty(n, np.uint64)
    for k in prange(n):
        zs11 = zs01 = zs00 = ls11 = ls01 = ls00 = np.uint64(0)
        for j in range(m):
            v = yf[k, j]
            v0, v1 = v & _M31, v >> np.uint64(31)
            zs11 += v1 * z1[j]
            zs01 += v1 * z0[j] + v0 * z1[j]
            zs00 += v0 * z0[j]
            ls11 += v1 * l1[j]
            ls01 += v1 * l0[j] + v0 * l1[j]
            ls00 += v0 * l0[j]
            if j & 1:
                zs11, zs01, zs00 = _fold(zs11), _fold(zs01), _fold(zs00)
                ls11, ls01, ls00 = _fold(ls11), _fold(ls01), _fold(ls00)
        zs11, zs01, zs00 = _fold(zs11), _fold(zs01), _fold(zs00)
        ls11, ls01, ls00 = _fold(ls11), _fold(ls01), _fold(ls00)
        t = one
        for c in range(width):
            last = y[k, size - 1, c]
            t = t + _P - last if t < last else t - last
        z[k] = _combine(zs11, zs01, zs00)
        l[k] = _combine(ls11, ls01, ls00)
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
