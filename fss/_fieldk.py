"""`fss.field`'s elementwise operations on large arrays as one fused numba loop each (no temporaries):
the same canonical residues as the numpy expressions, which keep small arrays (`field.LOOP_MIN`)."""
from __future__ import annotations

import numpy as np

from ._cache import njit

_P = np.uint64((1 << 61) - 1)


@njit(inline="always")
def _fold(x):
    x = (x & _P) + (x >> np.uint64(61))
    return x - _P if x >= _P else x


@njit(nogil=True)
def add(a, b, out):
    for i in range(out.size):
        out[i] = _fold(a[i] + b[i])


@njit(nogil=True)
def sub(a, b, out):
    for i in range(out.size):
        x = b[i]
        out[i] = _fold(a[i] + (_P - x if x != np.uint64(0) else x))


@njit(nogil=True)
def mul(a, b, out):
    m31, m30 = np.uint64((1 << 31) - 1), np.uint64((1 << 30) - 1)
    for i in range(out.size):
        x, y = a[i], b[i]
        a0, a1, b0, b1 = x & m31, x >> np.uint64(31), y & m31, y >> np.uint64(31)
        mid = a1 * b0 + a0 * b1
        out[i] = _fold((a1 * b1 << np.uint64(1)) + (mid >> np.uint64(30)) + ((mid & m30) << np.uint64(31)) + a0 * b0)
