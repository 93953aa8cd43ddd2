"""Validation of user inputs (points, alphas, payloads) into the internal uint64 form.

One place, at the public entry; everything after it trusts the arrays it returns.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from ._lazy import numpy as _numpy

from .errors import ParameterError
from .params import TreeParams, check_int

if TYPE_CHECKING:
    import numpy as np
else:
    np = _numpy(__name__)  # numpy at first use (`fss._lazy`)

_U64 = 1 << 64


def _int_array(values: object, lo: int, hi: int, name: str) -> np.ndarray:
    """`values` (ints or an integer array) checked to lie in [lo, hi], as uint64 (two's complement)."""
    try:
        # Python ints go through an object array: numpy's own inference turns mixed large ints to float.
        arr = values if isinstance(values, np.ndarray) else np.array(values, dtype=object)
    except (ValueError, TypeError) as exc:
        raise ParameterError(f"{name} must be an array of ints: {exc}") from None
    if arr.dtype.kind in "iu":
        if arr.size:
            least, most = int(arr.min()), int(arr.max())
            if least < lo or most > hi:
                raise ParameterError(f"{name} must lie in [{lo}, {hi}], got {least if least < lo else most}")
        return arr.astype(np.uint64)
    if arr.dtype == object:
        flat = [check_int(name, v.item() if isinstance(v, np.bool_) else v, lo, hi) % _U64 for v in arr.reshape(-1)]
        return np.array(flat, dtype=np.uint64).reshape(arr.shape)
    raise ParameterError(f"{name} must hold ints, got dtype {arr.dtype}")


def points(p: TreeParams, xs: object, name: str = "x") -> np.ndarray:
    """Public-domain points -> internal uint64 points (x xor c), any shape."""
    lo, hi = p.domain_range()
    arr = _int_array(xs, lo, hi, name)  # always a new array: mapped in place (no temporaries)
    arr &= np.uint64(p.domain_mask)
    arr ^= np.uint64(p.input_xor)
    return arr


def point(p: TreeParams, x: object, name: str = "x") -> int:
    if type(x) is int:  # the common case, without numpy: what `points` computes for one int
        lo, hi = p.domain_range()
        return ((check_int(name, x, lo, hi) % _U64) & p.domain_mask) ^ p.input_xor
    if isinstance(x, (bool, np.bool_)) or np.ndim(x) != 0:  # type: ignore[arg-type]  # np.ndim takes any object
        raise ParameterError(f"{name} must be a single int, got {type(x).__name__}")
    return int(points(p, x, name))


def payload(p: TreeParams, beta: object) -> "int | np.ndarray":
    """One key's payload: `payloads(p, beta, 1)[0]`, or for one int over the ring that int reduced (one
    key's gen, without an array)."""
    if type(beta) is int and not p.prime:
        return check_int("beta", beta, -(1 << (p.out_bits - 1)), p.mask) % _U64 & p.mask
    return payloads(p, beta, 1)[0]


def payloads(p: TreeParams, betas: object, n: int) -> np.ndarray:
    """Payloads -> (n, width) uint64 reduced mod 2^out_bits.

    Accepted: one int (every element of every key); for width 1 a 1-D array of n ints; for width > 1
    a sequence of width ints (the same vector for every key) or an (n, width) array. Each value lies in
    [-2^(out_bits-1), 2^out_bits) and is taken mod 2^out_bits; for F_p (group "p61") in (-p, p), mod p."""
    w = p.width
    if type(betas) is int and not p.prime:  # one int (every gen's default): what the general path gives
        v = check_int("beta", betas, -(1 << (p.out_bits - 1)), p.mask) % _U64 & p.mask
        return np.full((n, w), v, np.uint64)
    if p.prime:
        arr = _int_array(betas, -(p.modulus - 1), p.modulus - 1, "beta")
    else:
        arr = _int_array(betas, -(1 << (p.out_bits - 1)), p.mask, "beta")
    if arr.ndim == 0:
        arr = np.full((n, w), arr, np.uint64)
    elif arr.ndim == 1 and w == 1 and arr.shape[0] == n:
        arr = arr.reshape(n, 1)
    elif arr.ndim == 1 and w > 1 and arr.shape[0] == w:
        arr = np.broadcast_to(arr, (n, w))
    elif arr.ndim != 2 or arr.shape != (n, w):
        raise ParameterError(f"beta of shape {arr.shape} does not fit {n} keys of width {w}")
    arr = np.array(arr, dtype=np.uint64, order="C", ndmin=2)
    if p.prime:  # negative values arrive in two's complement: -x -> p - x
        neg = arr >= np.uint64(1 << 63)
        return np.where(neg, np.uint64(p.modulus) - (np.uint64(0) - arr * neg), arr)
    return arr & np.uint64(p.mask)
