"""Shared test helpers: the function families under test and the truth to compare against."""
from __future__ import annotations

import numpy as np

from fss import DCF, DPF

CMPS = ("lt", "le", "gt", "ge")


def make(kind: str, bits: int, out_bits: int, width: int, signed: bool):
    if kind == "eq":
        return DPF(bits, out_bits, width, signed=signed)
    return DCF(bits, out_bits, width, cmp=kind, signed=signed)


def truth(fn, alphas: np.ndarray, xs: np.ndarray, betas: np.ndarray) -> np.ndarray:
    """f(x) per row, straight from the definition: betas (n, width) where `x cmp alpha`, else 0."""
    a, x = alphas.astype(object), xs.astype(object)
    holds = {
        "lt": x < a, "le": x <= a, "gt": x > a, "ge": x >= a, "eq": x == a,
    }[fn.params.cmp].astype(bool)
    return np.where(holds[:, None], betas, np.uint64(0)).astype(np.uint64)


def as_rows(fn, shares: np.ndarray) -> np.ndarray:
    """(n,) or (n, width) shares -> (n, width)."""
    return shares.reshape(shares.shape[0], fn.width)


def add(fn, y0: np.ndarray, y1: np.ndarray) -> np.ndarray:
    return (y0 + y1) & np.uint64(fn.params.mask)
