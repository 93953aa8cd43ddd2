"""Verification of reports at the close (issue 12): the two servers jointly check that each report's
grid values are shares of an honest step function, without learning anything else about it.
The construction and its security argument: docs/verification.md. Pure functions over the prime
field F_p of `fss.field` (p = 2^61 - 1) on numpy arrays; no HTTP, no storage, no keys.

Per report (n reports at once, arrays along axis 0), server b in {0, 1} holds
    y_b      (n, N) or (n, N, width): its shares of the DCF's values at the N grid points
    a_b, A_b (n,):  its shares of the client's pair (a, a^2)
and both servers hold the challenges (r, s) = `challenges(shared_key, context, M)`, drawn after the
set of reports is frozen. The exchange:

    D_b, top_b = unit_vector_shares(b, y_b, payload)            # local, linear
    e_b, state_b = first_message(b, D_b, top_b, r, s, a_b)      # b sends e_b
    e = e_0 + e_1                                               # opened: z - a, uniform
    V_b = second_message(b, state_b, e, a_b, A_b)               # b sends V_b
    ok = accepted(V_0, V_1)                                     # V_0 + V_1 == 0

V = V_0 + V_1 = (sum_i r_i D_i)^2 - sum_i r_i^2 D_i + s * top, which is 0 for every honest report and,
for any other report, a nonzero polynomial of degree 2 in (r, s): accepted with probability <= 2/p.
`check_value` computes V directly from the reconstructed vector (for the tests' exhaustive count
over a small prime).

The service runs the same check through `Check` (one per payload kind), which works on the grid
values y directly (the weights of D folded into y, computed once per close), also opens `top` so that
a rejection has a reason class ("weight": the report's total is not 1; "shape": total 1 but not a
single unit step), and moves only arrays between the servers: round one opens (n, E) elements,
round two one element per report.
"""
from __future__ import annotations

import hashlib
import secrets

import numpy as np

from fss import field as F

from ..errors import ParameterError
from . import _sketch

P = F.P
DOMAIN = b"fss-dpcdf/verify/challenges/v1"
PAYLOADS = ("count", "label")


def _u64(x: object) -> np.ndarray:
    return np.asarray(x, dtype=np.uint64)


def elements_from_bytes(data: bytes, count: int) -> np.ndarray:
    """`count` field elements from 16 bytes each (an element = the 128-bit little-endian chunk mod p:
    statistical distance < 2^-122 from uniform per element)."""
    if len(data) < 16 * count:
        raise ValueError(f"need {16 * count} bytes for {count} elements, got {len(data)}")
    words = np.frombuffer(data[: 16 * count], dtype="<u8").astype(np.uint64).reshape(count, 2)
    return F.reduce128(words[:, 0], words[:, 1])


def challenges(shared_key: bytes, context: bytes, length: int) -> tuple[np.ndarray, np.uint64]:
    """The challenges (r in F_p^length, s in F_p) from the servers' shared verification key and the
    context (the task id and the hash of the frozen report set): SHAKE-128 over a domain label and
    the length-prefixed key and context. Deterministic, so both servers derive the same values;
    unpredictable to clients, who never see `shared_key`."""
    if len(shared_key) < 16:
        raise ValueError("the shared verification key must have at least 16 bytes")
    xof = hashlib.shake_128()
    for part in (DOMAIN, shared_key, context):
        xof.update(len(part).to_bytes(8, "little") + part)
    vals = elements_from_bytes(xof.digest(16 * (length + 1)), length + 1)
    return vals[:length], vals[length]


def client_pairs(n: int, randomness: bytes | None = None) -> tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]:
    """An honest client's correlated randomness for n reports: a uniform, A = a^2, each additively
    shared; returns ((a_0, A_0), (a_1, A_1)). `randomness`: 48 bytes per report (the OS CSPRNG if None)."""
    data = secrets.token_bytes(48 * n) if randomness is None else randomness
    vals = elements_from_bytes(data, 3 * n).reshape(3, n) if n else np.zeros((3, 0), np.uint64)
    a, a_0, big_0 = vals
    big = F.mul(a, a)
    return (a_0, big_0), (F.sub(a, a_0), F.sub(big, big_0))


def share(values: np.ndarray, randomness: bytes | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Additive shares (x_0 uniform, x_1 = x - x_0) of canonical elements `values` (tests and clients)."""
    values = _u64(values)
    data = secrets.token_bytes(16 * values.size) if randomness is None else randomness
    x0 = elements_from_bytes(data, values.size).reshape(values.shape)
    return x0, F.sub(values, x0)


def unit_vector_shares(party: int, y: np.ndarray, payload: str = "count") -> tuple[np.ndarray, np.ndarray]:
    """Server `party`'s shares of the vector that must be a unit vector, and of its top entry.

    count (y of shape (n, N)): D_i = y_i - y_{i-1} (y_{-1} = 0), so an honest report (y_i = [i >= alpha])
    gives D = e_alpha; top = 1 - y_{N-1} (0 for an honest report; party 0 holds the constant 1).
    label (y of shape (n, N, 2), payload (label, 1 - label)): D = (diff of y^(0), diff of y^(1)) in
    F_p^(2N), a unit vector exactly when the report is honest; top = 1 - y^(0)_{N-1} - y^(1)_{N-1}.
    Returns (D (n, M), top (n,)) with M = N or 2N."""
    if payload not in PAYLOADS:
        raise ValueError(f"payload must be one of {PAYLOADS}, got {payload!r}")
    y = _u64(y)
    if payload == "count":
        if y.ndim != 2:
            raise ValueError(f"count shares have shape (n, N), got {y.shape}")
        parts = [y]
    else:
        if y.ndim != 3 or y.shape[2] != 2:
            raise ValueError(f"label shares have shape (n, N, 2), got {y.shape}")
        parts = [y[:, :, 0], y[:, :, 1]]
    diffs, top = [], np.full(y.shape[0], 1 if party == 0 else 0, np.uint64)
    for part in parts:
        prev = np.zeros_like(part)
        prev[:, 1:] = part[:, :-1]
        diffs.append(F.sub(part, prev))
        top = F.sub(top, part[:, -1])
    return np.concatenate(diffs, axis=1), top


def first_message(
    party: int, d_share: np.ndarray, top_share: np.ndarray, r: np.ndarray, s: object, a_share: np.ndarray
) -> tuple[np.ndarray, tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Local sketch: z_b = sum_i r_i D_b,i, L_b = sum_i r_i^2 D_b,i, T_b = s * top_b (all linear in
    the shares), and the message e_b = z_b - a_b. Returns (e_b, state kept for `second_message`)."""
    del party  # every term is linear: both parties compute the same way
    r = _u64(r)
    z = F.dot(d_share, r[None, :])
    big_l = F.dot(d_share, F.mul(r, r)[None, :])
    t = F.mul(top_share, np.full_like(top_share, _u64(s)))
    return F.sub(z, _u64(a_share)), (z, big_l, t)


def second_message(party: int, state: tuple, e: np.ndarray, a_share: np.ndarray, big_a_share: np.ndarray) -> np.ndarray:
    """V_b = [z^2]_b - L_b + T_b with [z^2]_b = [b = 0] e^2 + 2 e a_b + A_b (e = z - a opened, so
    z^2 = e^2 + 2 e a + a^2 for any a, and exactly z^2 + (A - a^2) if the client's A is off)."""
    _, big_l, t = state
    e = _u64(e)
    sq = F.add(F.mul(F.add(e, e), _u64(a_share)), _u64(big_a_share))
    if party == 0:
        sq = F.add(sq, F.mul(e, e))
    return F.add(F.sub(sq, big_l), t)


def accepted(v_0: np.ndarray, v_1: np.ndarray) -> np.ndarray:
    """A report counts iff its opened check value V_0 + V_1 is 0 (bool array)."""
    return F.add(v_0, v_1) == 0


def verify(
    y_0: np.ndarray, y_1: np.ndarray, pair_0: tuple, pair_1: tuple, r: np.ndarray, s: object, payload: str = "count"
) -> tuple[np.ndarray, np.ndarray, tuple[np.ndarray, np.ndarray]]:
    """Both servers' sides of the exchange in one process (tests, simulations): returns
    (accepted, opened e, (V_0, V_1)). The protocol runs the same functions on two machines."""
    d0, t0 = unit_vector_shares(0, y_0, payload)
    d1, t1 = unit_vector_shares(1, y_1, payload)
    e0, st0 = first_message(0, d0, t0, r, s, pair_0[0])
    e1, st1 = first_message(1, d1, t1, r, s, pair_1[0])
    e = F.add(e0, e1)
    v0 = second_message(0, st0, e, *pair_0)
    v1 = second_message(1, st1, e, *pair_1)
    return accepted(v0, v1), e, (v0, v1)


def check_value(d: object, r: object, s: object, delta: object = 0, p: int = P) -> object:
    """The opened value V as a function of the reconstructed vector: with d = (D_0 .. D_{M-1}, top),
    V = (sum_i r_i D_i)^2 - sum_i r_i^2 D_i + s * top + delta (mod p), delta = A - a^2 the client's
    error in its pair. Works on Python ints or int64 numpy arrays broadcast along the last axis of d
    and r (keep p below 2^31 for arrays so that products fit)."""
    d, r = np.asarray(d, dtype=object if p > 1 << 31 else np.int64), np.asarray(r, dtype=object if p > 1 << 31 else np.int64)
    body, top = d[..., :-1], d[..., -1]
    z = np.sum(r * body, axis=-1) % p
    big_l = np.sum((r * r % p) * body % p, axis=-1) % p
    return (z * z - big_l + s * top + delta) % p


# --- the service's interface: one `Check` per payload kind ------------------------------------------
OK, WEIGHT, SHAPE, RANGE = 0, 1, 2, 3
REASONS = {WEIGHT: "weight", SHAPE: "shape", RANGE: "range"}
"""Why a report was excluded (the class a failed check falls in; honest reports never fail):
weight: its grid values do not add up to one report (payload 0, 2, 10^6, -1, a step outside the
grid, labels that sum to 0 or 2); shape: total weight 1 but not one unit step (two steps, a step
up and one down, a label outside {0, 1}, keys that disagree); range: a calibration probability
outside [0, 2^16]."""


class Check:
    """The check of one payload kind over a grid of `size` points, in the two rounds the servers run.

        x_0, x_1 = check.client_extras(betas)                 # the client, one row per report
        msg_b, st_b = check.round_one(b, y_b, x_b, ch)        # each server; sends msg_b (n, E)
        opened = msg_0 + msg_1                                 # (mod p)
        v_b = check.round_two(b, st_b, opened, x_b)           # each server; sends v_b (n,)
        reasons = check.verdicts(opened, v_0 + v_1)           # 0 = counts, else a REASONS key

    y_b: the server's shares of every report's values at the grid points, (n, size) or
    (n, size, width); ch = check.challenges(key, context), the same on both servers."""

    def __init__(self, payload: str, size: int):
        if payload not in PAYLOADS:
            raise ParameterError(f"reports of payload {payload!r} cannot be verified (verified payloads: {PAYLOADS})")
        self.payload, self.size = payload, int(size)
        self.width = 1 if payload == "count" else 2

    extras = 2  # field elements the client adds per server and report: shares of (a, a^2)
    opened = 2  # elements each server sends per report in round one: (e, top)

    def challenges(self, key: bytes, context: bytes) -> "Challenges":
        r, s = challenges(key, context, self.size * self.width)
        return Challenges.fold(r, s, self.size, self.width)

    def client_extras(self, betas: object = None, randomness: bytes | None = None) -> tuple[np.ndarray, np.ndarray]:
        """The client's shares of its pair (a, a^2) per report: ((n, 2), (n, 2)). `betas`: one row per
        report (only its count matters here)."""
        n = int(np.asarray(betas).shape[0])
        (a0, big0), (a1, big1) = client_pairs(n, randomness)
        return np.stack([a0, big0], axis=1), np.stack([a1, big1], axis=1)

    def _y(self, y: np.ndarray) -> np.ndarray:
        y = np.ascontiguousarray(y, dtype=np.uint64)
        if y.ndim == 2 and self.width == 1:
            y = y[:, :, None]
        if y.shape[1:] != (self.size, self.width):
            raise ParameterError(f"grid values of shape (n, {self.size}, {self.width}) expected, got {y.shape}")
        return y

    def round_one(self, party: int, y: np.ndarray, extras: np.ndarray, ch: "Challenges") -> tuple[np.ndarray, np.ndarray]:
        """(message (n, 2): e_b = z_b - a_b and top_b; state (n, 2): L_b and s * top_b), where
        z_b = sum_i r_i D_b,i and L_b = sum_i r_i^2 D_b,i are taken on y_b with the folded weights."""
        y = self._y(y)
        z, big_l, top = _sketch.sketch(y, ch.wz, ch.wl, np.uint64(1 if party == 0 else 0))
        a = _u64(extras)[:, 0]
        msg = np.stack([F.sub(z, a), top], axis=1)
        return msg, np.stack([big_l, F.mul(top, np.full_like(top, ch.s))], axis=1)

    def round_two(self, party: int, state: np.ndarray, opened: np.ndarray, extras: np.ndarray) -> np.ndarray:
        """V_b = [b = 0] e^2 + 2 e a_b + A_b - L_b + s top_b (`second_message`)."""
        e, x = _u64(opened)[:, 0], _u64(extras)
        sq = F.add(F.mul(F.add(e, e), x[:, 0]), x[:, 1])
        if party == 0:
            sq = F.add(sq, F.mul(e, e))
        return F.add(F.sub(sq, state[:, 0]), state[:, 1])

    def verdicts(self, opened: np.ndarray, v: np.ndarray) -> np.ndarray:
        """Per report: OK (0), WEIGHT if the opened top is not 0, else SHAPE if V is not 0 (uint8)."""
        top = _u64(opened)[:, 1]
        return np.where(top != 0, WEIGHT, np.where(_u64(v) != 0, SHAPE, OK)).astype(np.uint8)


class Challenges:
    """The challenges of one close folded into weights on the grid values: with r_{i,c} the challenge
    of D's entry i of component c (r_N = 0), wz[i, c] = r_i - r_{i+1} and wl[i, c] = r_i^2 - r_{i+1}^2,
    so that sum_i r_i D_i = sum_i wz_i y_i (summation by parts) and likewise for L."""

    def __init__(self, wz: np.ndarray, wl: np.ndarray, s: np.uint64):
        self.wz, self.wl, self.s = wz, wl, np.uint64(s)

    @classmethod
    def fold(cls, r: np.ndarray, s: object, size: int, width: int) -> "Challenges":
        r = _u64(r).reshape(width, size).T  # component c's challenges are r[c*size : (c+1)*size]
        nxt = np.zeros_like(r)
        nxt[:-1] = r[1:]
        r2, nxt2 = F.mul(r, r), F.mul(nxt, nxt)
        return cls(np.ascontiguousarray(F.sub(r, nxt)), np.ascontiguousarray(F.sub(r2, nxt2)), _u64(s))
