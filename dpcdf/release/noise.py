"""Exact discrete Laplace noise from integer arithmetic (Canonne, Kamath, Steinke, "The Discrete
Gaussian for Differential Privacy", NeurIPS 2020, Algorithms 1 and 2).

DLap(t) has P(x) proportional to exp(-|x| / t) on the integers; with t = sensitivity / epsilon it gives
epsilon-DP for integer-valued queries. The scale is a rational num/den, and every step draws uniform
integers by rejection from 64-bit words, so no floating point touches the sampling path (no Mironov
2012 attack) and the shares of the two-server protocol stay exact integers.

Where the words come from:
- `secure_noise`: the OS CSPRNG (`secrets`), for the central release.
- `prf_noise`: AES-128 as a PRF keyed by a secret seed, one keystream per node id (block j of node
  v = AES_k(v || j)), so a server derives the same noise for a node at any time, in any process,
  without storing a tree of 2^32 leaves.
"""
from __future__ import annotations

import hashlib
import hmac
import math
import secrets
from fractions import Fraction

import numpy as np
from Crypto.Cipher import AES
from numba import njit

from ..errors import ParameterError

_MAX_DEN = 1 << 20  # epsilon is rounded down to a fraction with a denominator at most this
EPSILON_ROUNDING = Fraction(1, _MAX_DEN)  # so it loses less than this: the bound privacy statements round within


MIN_EPSILON = 1e-6


def check_epsilon(epsilon: object) -> float:
    """epsilon as a positive finite float; ParameterError for anything else (also an int too large for a float)."""
    try:
        ok = not isinstance(epsilon, bool) and isinstance(epsilon, (int, float)) and math.isfinite(epsilon) and epsilon > 0
    except OverflowError:
        ok = False
    if not ok or not isinstance(epsilon, (int, float)):
        raise ParameterError(f"epsilon must be a finite number > 0, got {epsilon!r:.60}")
    return float(epsilon)


def scale_fraction(sensitivity: int, epsilon: float) -> Fraction:
    """The Laplace scale sensitivity / epsilon as a fraction, with epsilon rounded *down* to a
    rational of denominator <= 2^20 (the private direction: the noise gets no smaller). Epsilon must
    be at least 1e-6 (below that the noise would dwarf any count anyway)."""
    check_epsilon(epsilon)
    if epsilon < MIN_EPSILON:  # often a mechanism's share of the budget: say what to change
        raise ParameterError(f"epsilon too small: a noise's share of the budget would be {epsilon:.3g}, below the least "
                             f"of {MIN_EPSILON:g} (the noise would dwarf any count); use a larger epsilon")
    eps = Fraction(epsilon).limit_denominator(_MAX_DEN)
    if eps > Fraction(epsilon):
        eps = Fraction(math.floor(Fraction(epsilon) * _MAX_DEN), _MAX_DEN)
    if eps <= 0:
        raise ParameterError(f"epsilon {epsilon!r} is too small to represent")
    return check_scale(Fraction(sensitivity) / eps)


def check_scale(scale: Fraction) -> Fraction:
    """The sampler's range: numerator and denominator below 2^40 (keeps den * k and u + t * v inside
    int64); so epsilon / sensitivity stays below about 10^12."""
    if scale.numerator >= 1 << 40 or scale.denominator >= 1 << 40:
        raise ParameterError(f"noise scale {scale} is out of range (epsilon too large for its sensitivity)")
    return scale


def dlaplace_variance(scale: Fraction | float) -> float:
    """Var of DLap(t) = 2 e^(-1/t) / (1 - e^(-1/t))^2."""
    q = math.exp(-1 / float(scale))
    return 2 * q / (1 - q) ** 2


# --- the sampler kernel ------------------------------------------------------------------------
@njit(cache=True, nogil=True)
def _below(words, pos, m):
    """Uniform integer in [0, m) from words[pos...] by rejection; returns (value, new pos), or
    (0, -1) when the words run out."""
    m64 = np.uint64(m)
    reject = (np.uint64(0) - m64) % m64  # 2^64 mod m: the words below it would bias the result
    while pos < words.shape[0]:
        w = words[pos]
        pos += 1
        if w >= reject:
            return np.int64(w % m64), pos
    return np.int64(0), np.int64(-1)


@njit(cache=True, nogil=True)
def _bern_exp_small(words, pos, num, den):
    """Bernoulli(exp(-num/den)) for 0 <= num <= den (CKS 2020, Algorithm 1); (bit, new pos)."""
    k = 1
    while True:  # the number of successes in Bernoulli(num / (den k)), k = 1, 2, ... is odd w.p. exp(-num/den)
        u, pos = _below(words, pos, den * k)
        if pos < 0:
            return np.int64(0), pos
        if u >= num:
            break
        k += 1
    return np.int64(k % 2), pos


@njit(cache=True, nogil=True)
def _bern_exp(words, pos, num, den):
    """Bernoulli(exp(-num/den)) for any num >= 0: exp(-g) = exp(-1)^floor(g) * exp(-(g - floor g)).
    (A loop, not recursion: numba's cache does not keep recursive functions safely.)"""
    while num > den:
        bit, pos = _bern_exp_small(words, pos, 1, 1)
        if pos < 0 or bit == 0:
            return np.int64(0), pos
        num -= den
    return _bern_exp_small(words, pos, num, den)


@njit(cache=True, nogil=True)
def _dlaplace_one(words, t_num, t_den):
    """One DLap(t_num / t_den) sample from a stream of words (CKS 2020, Algorithm 2, with
    scale = t/s in their notation: t = t_num, s = t_den). Returns (sample, ok)."""
    pos = np.int64(0)
    while True:
        u, pos = _below(words, pos, t_num)
        if pos < 0:
            return np.int64(0), False
        d, pos = _bern_exp(words, pos, u, t_num)
        if pos < 0:
            return np.int64(0), False
        if d == 0:
            continue
        v = np.int64(0)
        while True:
            a, pos = _bern_exp(words, pos, 1, 1)
            if pos < 0:
                return np.int64(0), False
            if a == 0:
                break
            v += 1
        y = (u + t_num * v) // t_den
        b, pos = _below(words, pos, 2)
        if pos < 0:
            return np.int64(0), False
        if b == 1 and y == 0:
            continue
        return (-y if b == 1 else y), True


@njit(cache=True, nogil=True)
def _dlaplace_rows(words, t_num, t_den, out, ok):
    """Row r of words (each row one independent stream) -> out[r]; ok[r] False if the row ran out."""
    for r in range(words.shape[0]):
        out[r], ok[r] = _dlaplace_one(words[r], t_num, t_den)


def _sample(streams, count: int, scale: Fraction) -> np.ndarray:
    """Samples from `streams(rows, words)`: a function giving, for rows `rows`, the first `words`
    words of each row's stream. A row that runs out is run again on a 16x longer prefix of the
    *same* stream, so its sample is what an endless stream would give: redrawing it from fresh
    randomness instead would bias the result (long draws are the large values)."""
    check_scale(scale)
    out = np.zeros(count, np.int64)
    todo = np.arange(count)
    words = 48
    while todo.size:
        ok = np.zeros(todo.size, np.bool_)
        vals = np.zeros(todo.size, np.int64)
        _dlaplace_rows(streams(todo, words), scale.numerator, scale.denominator, vals, ok)
        out[todo[ok]] = vals[ok]
        todo = todo[~ok]
        words *= 16
    return out


def secure_noise(count: int, scale: Fraction) -> np.ndarray:
    """`count` independent DLap(scale) samples with randomness from the OS CSPRNG."""
    drawn: dict[int, np.ndarray] = {}  # rows asked for again: their stream so far, to be extended

    def fresh(rows: int, words: int) -> np.ndarray:
        return np.frombuffer(secrets.token_bytes(8 * words * rows), "<u8").astype(np.uint64).reshape(rows, words)

    def streams(rows: np.ndarray, words: int) -> np.ndarray:
        if not drawn and rows.size == count:
            first = fresh(count, words)
            drawn.update({-1: first})
            return first
        out = np.empty((rows.size, words), np.uint64)
        for k, r in enumerate(rows):
            have = drawn.get(int(r), drawn[-1][r])
            out[k, : have.size] = have
            out[k, have.size :] = fresh(1, words - have.size)[0]
            drawn[int(r)] = out[k]
        return out

    return _sample(streams, count, scale)


def prf_key(seed: bytes, label: str) -> bytes:
    """The AES key of one noise domain (a task and mechanism) under a server's secret seed."""
    if not isinstance(seed, (bytes, bytearray)) or len(seed) < 16:
        raise ParameterError("the noise seed must be at least 16 bytes")
    return hmac.new(bytes(seed), b"dpcdf/noise/v1/" + label.encode(), hashlib.sha256).digest()[:16]


def prf_noise(key: bytes, node_ids: np.ndarray, scale: Fraction) -> np.ndarray:
    """DLap(scale) for each node id (uint64), each from its own keystream AES_key(id || j), j = 0..:
    the same id always gives the same sample under the same key."""
    ids = np.asarray(node_ids, dtype=np.uint64).reshape(-1)
    ecb = AES.new(key, AES.MODE_ECB)

    def streams(rows: np.ndarray, words: int) -> np.ndarray:
        blocks = (words + 1) // 2
        inp = np.empty((rows.size, blocks, 2), np.uint64)
        inp[:, :, 0] = ids[rows][:, None]
        inp[:, :, 1] = np.arange(blocks, dtype=np.uint64)[None, :]
        raw = ecb.encrypt(inp.astype("<u8").tobytes())
        return np.frombuffer(raw, "<u8").astype(np.uint64).reshape(rows.size, 2 * blocks)[:, :words].copy()

    return _sample(streams, ids.size, scale)
