"""The verification's hot loop (numba): per report, the two weighted sums of its grid values that the
check needs, and its top entry, in F_p (p = 2^61 - 1). See `verify.Check.round_one`."""
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


@njit(parallel=True, cache=True)
def column_sums(y):
    """sum over k of y[k] (N, w), mod p: a server's share of the histogram."""
    n, size, width = y.shape
    out = np.zeros((size, width), np.uint64)
    for i in prange(size):
        for c in range(width):
            acc = np.uint64(0)
            for k in range(n):
                acc = _fold(acc + y[k, i, c])
            out[i, c] = acc
    return out
