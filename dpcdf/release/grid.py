"""Quantizing values to grid indices: the domain every release and every DCF key lives on."""
from __future__ import annotations

import math

import numpy as np

from ..errors import DomainError, ParameterError

MAX_BITS = 32


class Grid:
    """Increasing thresholds t_0 < ... < t_{N-1}. A value v gets index(v) = the smallest i with
    v <= t_i, so that F(t_i) = #{v : index(v) <= i} / n is the ECDF at t_i exactly.

    Values above t_{N-1} are clamped to the last index by default (F(t_{N-1}) = 1 then holds; say so
    when you report); with strict=True they raise `DomainError`. NaN always raises.
    """

    def __init__(self, thresholds: np.ndarray, strict: bool = False):
        t = np.asarray(thresholds, dtype=np.float64)
        if t.ndim != 1 or t.size < 2:
            raise ParameterError("a grid needs at least 2 thresholds in a 1-D array")
        if not np.all(np.isfinite(t)):
            raise ParameterError("grid thresholds must be finite")
        if not np.all(np.diff(t) > 0):
            raise ParameterError("grid thresholds must be strictly increasing")
        if t.size > 1 << MAX_BITS:
            raise ParameterError(f"a grid has at most 2^{MAX_BITS} thresholds")
        self.thresholds = t
        self.strict = strict

    @classmethod
    def uniform(cls, lo: float, hi: float, bits: int, strict: bool = False) -> "Grid":
        """2^bits evenly spaced thresholds from lo to hi (both included)."""
        bits = _check_bits(bits)
        _check_range(lo, hi)
        return cls(np.linspace(lo, hi, 1 << bits), strict)

    @classmethod
    def log(cls, lo: float, hi: float, bits: int, strict: bool = False) -> "Grid":
        """2^bits geometrically spaced thresholds from lo > 0 to hi (the paper's section 3.1, for
        when the relative error matters more than the absolute one)."""
        bits = _check_bits(bits)
        _check_range(lo, hi)
        if lo <= 0:
            raise ParameterError(f"a logarithmic grid needs lo > 0, got {lo}")
        return cls(np.geomspace(lo, hi, 1 << bits), strict)

    @classmethod
    def from_thresholds(cls, thresholds, strict: bool = False) -> "Grid":
        return cls(thresholds, strict)

    @classmethod
    def integers(cls, size_or_lo: int, hi: int | None = None, strict: bool = True) -> "Grid":
        """Integer thresholds: `integers(size)` is 0, 1, ..., size - 1 (data that are already indices);
        `integers(lo, hi)` is lo, lo + 1, ..., hi (integer data such as ages: every answer at an integer
        is then exact, no value is shifted to a neighbouring threshold). Values outside raise
        `DomainError` (strict) unless strict=False, which clamps those above hi."""
        if hi is None:
            lo, hi = 0, size_or_lo - 1 if isinstance(size_or_lo, int) and not isinstance(size_or_lo, bool) else None
            if hi is None or hi < 1:
                raise ParameterError(f"size must be an int >= 2, got {size_or_lo!r}")
        else:
            lo = size_or_lo
        if any(not isinstance(v, (int, np.integer)) or isinstance(v, bool) for v in (lo, hi)) or hi <= lo:
            raise ParameterError(f"integers(lo, hi) takes two integers lo < hi, got {size_or_lo!r}, {hi!r}")
        return cls(np.arange(int(lo), int(hi) + 1, dtype=np.float64), strict=strict)

    def shifts_integers(self, values) -> bool:
        """Whether `values` look like integers (every one a whole number) while some of them inside the
        grid's range fall between thresholds: F(t) at such an integer t is read at the threshold below
        it, and the values equal to t count at the next one (`Release.read_at`). A grid with a threshold on
        every integer (`Grid.integers(lo, hi)`) answers them exactly."""
        v = np.asarray(values, dtype=np.float64).reshape(-1)
        v = v[np.isfinite(v)]
        if v.size == 0 or not np.all(v == np.round(v)):
            return False
        inside = np.unique(v[(v >= self.thresholds[0]) & (v <= self.thresholds[-1])])
        return bool(inside.size) and not np.all(np.isin(inside, self.thresholds))

    @property
    def size(self) -> int:
        return self.thresholds.size

    @property
    def bits(self) -> int:
        """Bits of an index: ceil(log2(size))."""
        return max(1, math.ceil(math.log2(self.size)))

    def index(self, values) -> np.ndarray:
        """Index of each value (int64): the smallest i with value <= t_i."""
        v = np.asarray(values, dtype=np.float64)
        if np.isnan(v).any():
            raise DomainError("NaN values have no grid index")
        idx = np.searchsorted(self.thresholds, v, side="left")
        over = idx >= self.size
        if over.any():
            if self.strict:
                bad = v[over].reshape(-1)[0]
                raise DomainError(f"value {bad} lies above the grid's last threshold {self.thresholds[-1]}")
            idx = np.minimum(idx, self.size - 1)
        return idx.astype(np.int64)

    def __repr__(self) -> str:
        return f"Grid({self.size} thresholds from {self.thresholds[0]:g} to {self.thresholds[-1]:g})"


def _check_bits(bits: object) -> int:
    if isinstance(bits, bool) or not isinstance(bits, int) or not 1 <= bits <= 24:
        raise ParameterError(f"bits must be an int in [1, 24], got {bits!r}")
    return bits


def _check_range(lo: float, hi: float) -> None:
    if not (math.isfinite(lo) and math.isfinite(hi) and lo < hi):
        raise ParameterError(f"need finite lo < hi, got {lo!r}, {hi!r}")
