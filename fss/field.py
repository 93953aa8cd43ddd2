"""The prime field F_p, p = 2^61 - 1 (a Mersenne prime), on numpy uint64 arrays.

Why this prime
    - Reduction is two shifts and an add: 2^61 = 1 (mod p), so x = x_lo + 2^61 x_hi = x_lo + x_hi.
      A 128-bit value (a whole AES block) reduces with one more fold, and a product of two field
      elements (122 bits) is computed exactly from 31-bit halves in uint64, without 128-bit integers.
    - A word's low 61 bits are exactly uniform on [0, p] minus p itself, so key format 2 takes an
      element from a 64-bit PRG word by rejection (`fss.prg`, "Prime-field payloads"): exactly
      uniform, where a word mod p would be 2^-61 off per element. Format 1 reduced a whole 128-bit
      block mod p: within c (p - c) / (2^128 p) < c / 2^128 = 2^-122 of uniform, c = 2^128 mod p = 2^6.
    - 2/p ~ 2^-60: the soundness error of the report check of docs/verification.md, per report.
    - Elements fit in 61 bits, so sums of up to 8 of them fit in a uint64 before reducing.

Every function takes and returns canonical elements (uint64 in [0, p)) unless its doc says
otherwise; none of them raises.
"""
from __future__ import annotations

import numpy as np

P = (1 << 61) - 1
_P = np.uint64(P)
_S61 = np.uint64(61)
_M31 = np.uint64((1 << 31) - 1)
_M30 = np.uint64((1 << 30) - 1)
_M32 = np.uint64((1 << 32) - 1)
_TWO32 = np.uint64(1 << 32)
LOOP_MIN = 1 << 14  # elements from which add, sub and mul run as one numba loop (`_fieldk`): the numpy expressions
# below make a temporary per operation (a calibration close's check, 20,000 reports: 0.14 s of F_p arithmetic)


def _looped(kernel, a: np.ndarray, b: np.ndarray) -> np.ndarray | None:
    """kernel over a and b broadcast together, or None below LOOP_MIN elements (then numpy)."""
    shape = np.broadcast_shapes(a.shape, b.shape)
    if int(np.prod(shape)) < LOOP_MIN:
        return None
    from . import _fieldk

    x = np.ascontiguousarray(np.broadcast_to(a, shape)).reshape(-1)
    y = np.ascontiguousarray(np.broadcast_to(b, shape)).reshape(-1)
    out = np.empty(x.size, np.uint64)
    getattr(_fieldk, kernel)(x, y, out)
    return out.reshape(shape)


def _fold(x: np.ndarray) -> np.ndarray:
    """Any uint64 -> [0, p): x = lo + 2^61 hi = lo + hi (< 2^61 + 8 < 2p), then one subtraction."""
    x = (x & _P) + (x >> _S61)
    return x - _P * (x >= _P).astype(np.uint64)  # no wrap-around: subtracts p only where x >= p


def reduce64(x: object) -> np.ndarray:
    """Any uint64 values -> canonical elements."""
    return _fold(np.asarray(x, dtype=np.uint64))


def reduce128(lo: object, hi: object) -> np.ndarray:
    """(lo + 2^64 hi) mod p for uint64 words lo, hi (an AES block read as two little-endian words)."""
    lo, hi = np.asarray(lo, np.uint64), np.asarray(hi, np.uint64)
    x0 = lo & _P
    x1 = (lo >> _S61) | ((hi << np.uint64(3)) & _P)  # bits 61..121
    x2 = hi >> np.uint64(58)  # bits 122..127
    return _fold(x0 + x1 + x2)  # < 2^61 * 2 + 2^6 < 2^63


def add(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a, b = np.asarray(a, np.uint64), np.asarray(b, np.uint64)
    out = _looped("add", a, b)
    return _fold(a + b) if out is None else out


def neg(a: np.ndarray) -> np.ndarray:
    a = np.asarray(a, np.uint64)
    return (_P - a) * (a != 0).astype(np.uint64)


def sub(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a, b = np.asarray(a, np.uint64), np.asarray(b, np.uint64)
    out = _looped("sub", a, b)
    return add(a, neg(b)) if out is None else out


def mul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Exact a * b mod p: with a = a1 2^31 + a0 (a1 < 2^30) and b likewise,
    a b = a1 b1 2^62 + (a1 b0 + a0 b1) 2^31 + a0 b0, and 2^62 = 2, 2^61 = 1 (mod p); every partial
    product fits in 62 bits and their reduced sum in 64."""
    a, b = np.asarray(a, np.uint64), np.asarray(b, np.uint64)
    out = _looped("mul", a, b)
    if out is not None:
        return out
    a0, a1 = a & _M31, a >> np.uint64(31)
    b0, b1 = b & _M31, b >> np.uint64(31)
    mid = a1 * b0 + a0 * b1  # < 2^62
    total = (a1 * b1 << np.uint64(1)) + (mid >> np.uint64(30)) + ((mid & _M30) << np.uint64(31)) + a0 * b0
    return _fold(total)  # < 2^61 + 2^32 + 2^61 + 2^62 < 2^64


def sum(a: np.ndarray, axis: int = -1) -> np.ndarray:  # noqa: A001 - the field's sum
    """Sum mod p along `axis` (up to 2^32 terms): the low and high 32-bit halves are summed
    separately in uint64, then recombined."""
    a = np.asarray(a, np.uint64)
    lo = np.sum(a & _M32, axis=axis, dtype=np.uint64)
    hi = np.sum(a >> np.uint64(32), axis=axis, dtype=np.uint64)
    return add(mul(reduce64(hi), np.full_like(hi, _TWO32)), reduce64(lo))


def dot(a: np.ndarray, b: np.ndarray, axis: int = -1) -> np.ndarray:
    """sum(a * b) mod p along `axis` (broadcasting a against b)."""
    return sum(mul(a, b), axis=axis)


def from_ints(values: object) -> np.ndarray:
    """Python ints (any sign, any size) -> canonical elements."""
    arr = np.asarray(values, dtype=object)
    return np.array([int(v) % P for v in arr.reshape(-1)], dtype=np.uint64).reshape(arr.shape)


def signed(a: np.ndarray) -> np.ndarray:
    """Canonical elements read as integers in (-p/2, p/2), int64."""
    a = np.asarray(a, np.uint64)
    wide = a.astype(np.int64)
    return np.where(a > _P >> np.uint64(1), wide - np.int64(P), wide)
