"""The report check as the textbook states it (issue 12): the two servers jointly check that each report's
grid values are shares of an honest step function, without learning anything else about it.
The construction and its security argument: docs/verification.md. Pure functions over the prime
field F_p of `fss.field` (p = 2^61 - 1) on numpy arrays; no HTTP, no storage, no keys.
This module is that construction one step per function: the oracle the tests hold `maths.Check`
(what the servers run) against. The service never imports it.

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
"""
from __future__ import annotations

import numpy as np

from fss import field as F

from ...release.payload import Payload
from .randomness import P, QMAX, _u64, range_weights

PAYLOADS = ("count", "label")  # the payloads of the single-sketch functions below


def unit_vector_shares(party: int, y: np.ndarray, payload: str = "count") -> tuple[np.ndarray, np.ndarray]:
    """Server `party`'s shares of the vector that must be a unit vector, and of its top entry.

    count (y of shape (n, N)): D_i = y_i - y_{i-1} (y_{-1} = 0), so an honest report (y_i = [i >= alpha])
    gives D = e_alpha; top = 1 - y_{N-1} (0 for an honest report; party 0 holds the constant 1).
    label (y of shape (n, N, 2), payload (label, 1 - label)): D = (diff of y^(0), diff of y^(1)) in
    F_p^(2N), a unit vector exactly when the report is honest; top = 1 - y^(0)_{N-1} - y^(1)_{N-1}.
    Returns (D (n, M), top (n,)) with M = N or 2N."""
    kind = Payload.get(payload)
    if kind is None or kind.scored:
        raise ValueError(f"payload must be one of {PAYLOADS}, got {payload!r}")
    y = _u64(y)
    if not kind.labelled:
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


# --- calibration reports (1, label, q): the three values the check opens ----------------------------
def calibration_check_values(
    y: object, bits: object, r: object, s: object, rho: object, sigma: object, rbits: object,
    deltas: tuple = (0, 0, 0), bound: int = QMAX, p: int = P,
) -> tuple:
    """The three values (V1, V2, V3) a calibration check opens, as functions of the reconstructed
    report: y (..., N, 3) the grid values of (1, label, q), bits (..., k) the claimed bits
    (k = len(range_weights(bound))); challenges r (..., 2N), s, rho (..., N), sigma, rbits (..., k, 2);
    the client's errors deltas = (A - a^2, c' - a' b', sum_j (A_j - a_j^2)). With D^(c) the
    differences of y^(c), top = 1 - y^(0)_{N-1} and q = y^(2)_{N-1}:

        V1 = check_value((D^(1), D^(0) - D^(1), top), r, s) + delta_1          unit and label
        V2 = sum_i rho_i D^(2)_i - q * sum_i rho_i D^(0)_i - delta_2           score on alpha
        V3 = sigma (q - sum_j w_j b_j) + sum_j (u_j^2 - L_j) + delta_3         range
             u_j = r_j1 + (r_j0 - r_j1) b_j,  L_j = r_j1^2 + (r_j0^2 - r_j1^2) b_j

    (u_j^2 - L_j = (b_j^2 - b_j)(r_j0 - r_j1)^2.) Mod p on Python ints (p = P) or int64 arrays
    broadcast along the leading axes (p < 2^31), for the tests' exhaustive counts over small primes;
    `Check` opens exactly these values (for bound = QMAX, p = P)."""
    dt = object if p > 1 << 31 else np.int64

    def arr(v: object) -> np.ndarray:
        return np.asarray(np.asarray(v, dtype=dt) % p, dtype=dt)  # stays an array when 0-d

    y, bits, r, rho, rbits, s, sigma = (arr(v) for v in (y, bits, r, rho, rbits, s, sigma))
    d1_err, d2_err, d3_err = (arr(v) for v in deltas)
    prev = np.zeros_like(y)
    prev[..., 1:, :] = y[..., :-1, :]
    d = (y - prev) % p
    d0, d1, d2 = d[..., 0], d[..., 1], d[..., 2]
    top, q = arr(1 - y[..., -1, 0]), arr(y[..., -1, 2])
    v1 = check_value(np.concatenate([d1, (d0 - d1) % p, top[..., None]], axis=-1), r, s, d1_err, p)
    v2 = (np.sum(rho * ((d2 - q[..., None] * d0 % p) % p) % p, axis=-1) - d2_err) % p
    w = np.array(range_weights(bound), dtype=dt) % p
    r0, r1 = rbits[..., 0], rbits[..., 1]
    u = (r1 + (r0 - r1) % p * bits) % p
    big_l = (r1 * r1 + (r0 * r0 - r1 * r1) % p * bits) % p
    lin = (q - np.sum(w * bits % p, axis=-1)) % p
    v3 = (sigma * lin + np.sum((u * u - big_l) % p, axis=-1) + d3_err) % p
    return v1, v2, v3
