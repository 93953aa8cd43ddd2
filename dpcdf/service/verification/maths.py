"""Verification of reports at the close (issue 12): the two servers jointly check that each report's
grid values are shares of an honest step function, without learning anything else about it.
The construction and its security argument: docs/verification.md. Pure functions over the prime
field F_p of `fss.field` (p = 2^61 - 1) on numpy arrays; no HTTP, no storage, no keys.

The exchange, V and its soundness are in `reference` (the textbook construction, one step per
function, which the tests hold this module against). The service runs the same check through
`Check` (one per payload kind), which works on the grid values y directly (the weights of D folded
into y, computed once per close), also opens `top` so that a rejection has a reason class
("weight": the report's total is not 1; "shape": total 1 but not a single unit step), and moves
only arrays between the servers: round one opens (n, E) elements, round two one element per
report (count, label) or three (calibration).

Against a server that deviates (issue 20), `Check(..., mac=True)` (what the service runs) adds a
MAC: the client also shares kappa * y (the keys' payload is (beta, kappa * beta)) and kappa * x,
kappa for a uniform kappa no server knows; each server derives its share of kappa times every opened
element in round one, and after the opening sigma_b = kappa_b * opened - [kappa * opened]_b
(`mac_values`) add up to kappa times any shift of the opening (`mac_ok`). No V is computed on an
opening whose MAC fails (`exchange` has the message order and the argument).

Calibration reports (payload (1, label, q), q an integer in [0, 2^16]) are checked by three
sub-checks, each opened as its own V: the textbook sketch on (D^(1), D^(0) - D^(1)) (unit step, label
in {0, 1}), the score on the same step (sum_i rho_i (D^(2)_i - q D^(0)_i) = 0, the product through
a client's Beaver triple) and the range of q (17 claimed bits, each checked as a unit vector
(b_j, 1 - b_j) with its own pair, and sigma (q - sum_j w_j b_j)). The client supplies 56 elements
per server (`calibration_extras`), the servers open 21 in round one and 3 in round two;
`reference.calibration_check_values` is the opened (V1, V2, V3) as a function of the reconstructed report.
"""
from __future__ import annotations

import secrets
from typing import cast

import numpy as np

from fss import field as F

from ...errors import ParameterError
from ...release.payload import Payload
from . import sketch
from .randomness import (BITS, CALIBRATION_EXTRAS, CALIBRATION_OPENED, QMAX, RANGE_WEIGHTS, X_BIT_A, X_BIT_AA, X_BITS, _u64,
                         calibration_extras, challenges, client_pairs, elements_from_bytes, range_bits)

CHECKED = tuple(p.value for p in Payload if p.verifiable)  # the payloads `Check` verifies


# --- the service's interface: one `Check` per payload kind ------------------------------------------
OK, WEIGHT, SHAPE, RANGE, MAC = 0, 1, 2, 3, 4
REASONS = {WEIGHT: "weight", SHAPE: "shape", RANGE: "range", MAC: "mac"}
"""Why a report was excluded (the class a failed check falls in; honest reports never fail):
weight: its grid values do not add up to one report (payload 0, 2, 10^6, -1, a step outside the
grid, labels that sum to 0 or 2); shape: total weight 1 but not one unit step (two steps, a step
up and one down, a label outside {0, 1}, keys that disagree, a calibration score not on the
report's step); range: a calibration report whose unit and score checks pass but whose range check
fails (a probability q outside [0, 2^16], claimed bits that are not bits or do not add up to q, or
a lying bit pair); mac: an opened element that does not match its MAC (a server deviated from the
protocol, or the client's MAC shares disagree): the report's check values were never computed."""


def mac_ok(sigma_0: np.ndarray, sigma_1: np.ndarray) -> np.ndarray:
    """Per report: whether every opened element passed its MAC (sigma_0 + sigma_1 == 0), bool (n,)."""
    return np.logical_not(F.add(_u64(sigma_0), _u64(sigma_1)).astype(bool).any(axis=1))


class Check:
    """The check of one payload kind over a grid of `size` points, in the two rounds the servers run.

        x_0, x_1 = check.client_extras(betas)                 # the client, one row per report
        msg_b, st_b = check.round_one(b, y_b, x_b, ch)        # each server; sends msg_b (n, E)
        opened = msg_0 + msg_1                                 # (mod p)
        v_b = check.round_two(b, st_b, opened, x_b)           # each server; sends v_b
        reasons = check.verdicts(opened, v_0 + v_1)           # 0 = counts, else a REASONS key

    y_b: the server's shares of every report's values at the grid points, (n, size) or
    (n, size, width); ch = check.challenges(key, context), the same on both servers.
    Per report: X = check.extras field elements from the client (x_b: (n, X)), E = check.opened
    elements opened in round one, and check.check_values elements in round two: v_b has shape
    (n,) if that is 1 (count, label), else (n, check_values) (calibration: 3). The service sends
    v_b and sums the two parties' arrays elementwise mod p, whatever their shape, and `verdicts`
    takes that sum."""

    def __init__(self, payload: Payload | str, size: int, mac: bool = False):
        kind = Payload.get(payload)
        if kind is None or not kind.verifiable:
            raise ParameterError(f"reports of payload {getattr(payload, 'value', payload)!r} cannot be verified "
                                 f"(verified payloads: {CHECKED})")
        self.payload, self.size, self.mac = kind, int(size), bool(mac)
        self.width = kind.width
        calibration = kind.scored  # three sub-checks (unit and label, score, q's range) instead of one sketch
        # field elements the client adds per server and report: shares of (a, a^2), or the calibration
        # extras (`calibration_extras`); with a MAC also kappa times each, and kappa (`Mac`)
        self.base_extras = CALIBRATION_EXTRAS if calibration else 2
        self.extras = 2 * self.base_extras + 1 if self.mac else self.base_extras
        # the keys' payload: the report's (width) values, with a MAC also kappa times each
        self.key_width = 2 * self.width if self.mac else self.width
        # elements each server sends per report in round one: (e, top), or `CALIBRATION_OPENED`
        self.opened = CALIBRATION_OPENED if calibration else 2
        # elements each server sends per report in round two: round_two returns (n,) if 1, else (n, k)
        self.check_values = 3 if calibration else 1

    def challenges(self, key: bytes, context: bytes) -> "Challenges":
        if self.payload.scored:
            return CalibrationChallenges.derive(key, context, self.size)
        r, s = challenges(key, context, self.size * self.width)
        return Challenges.fold(r, s, self.size, self.width)

    def client_extras(self, betas: object = None, randomness: bytes | None = None) -> tuple[np.ndarray, np.ndarray]:
        """The client's shares of its extras per report: ((n, X), (n, X)), X = `self.extras`.
        count, label: the pair (a, a^2); `betas`: one row per report (only its count matters).
        calibration: `betas` (n, 3) rows (1, label, q) with q an integer in [0, QMAX] (else
        `ParameterError`: a client crafting a malformed report uses `calibration_extras`), and the
        extras are those of `calibration_extras` with q's bits (`range_bits`); `randomness`:
        `CALIBRATION_RANDOMNESS` bytes per report (the OS CSPRNG if None)."""
        if self.payload.scored:
            rows = np.asarray(betas, dtype=object)
            if rows.ndim != 2 or rows.shape[1] != 3:
                raise ParameterError(f"calibration payloads are rows (1, label, q), got shape {rows.shape}")
            q = [int(v) for v in rows[:, 2]]
            if any(not 0 <= v <= QMAX or v != w for v, w in zip(q, rows[:, 2])):
                raise ParameterError(f"a calibration probability q must be an integer in [0, {QMAX}]")
            return calibration_extras(range_bits(np.array(q, dtype=np.int64)), randomness)
        n = int(np.asarray(betas).shape[0])
        (a0, big0), (a1, big1) = client_pairs(n, randomness)
        return np.stack([a0, big0], axis=1), np.stack([a1, big1], axis=1)

    def client_report(self, betas: object, randomness: bytes | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """What an honest client makes per report for a check with a MAC: the keys' payload rows
        (n, key_width) = (beta, kappa * beta) as field elements, and each server's extras (n, extras) =
        shares of (x, kappa * x, kappa), x the check's extras (`client_extras`), kappa uniform from
        the OS CSPRNG. Without a MAC: (beta, x_0, x_1)."""
        rows = np.asarray(betas, dtype=object).reshape(-1, self.width)
        x0, x1 = self.client_extras(rows, randomness)
        beta = F.from_ints(rows)
        if not self.mac:
            return beta, x0, x1
        n = rows.shape[0]
        kappa, k0 = (elements_from_bytes(secrets.token_bytes(32 * n), 2 * n).reshape(2, n) if n
                     else np.zeros((2, 0), np.uint64))
        x = F.add(x0, x1)
        kx = F.mul(x, kappa[:, None])
        kx0 = elements_from_bytes(secrets.token_bytes(16 * kx.size), kx.size).reshape(kx.shape) if n else kx
        ext0 = np.column_stack([x0, kx0, k0])
        ext1 = np.column_stack([x1, F.sub(kx, kx0), F.sub(kappa, k0)])
        return np.column_stack([beta, F.mul(beta, kappa[:, None])]), ext0, ext1

    def _y(self, y: np.ndarray) -> np.ndarray:
        y = np.ascontiguousarray(y, dtype=np.uint64)
        if y.ndim == 2 and self.key_width == 1:
            y = y[:, :, None]
        if y.shape[1:] != (self.size, self.key_width):
            raise ParameterError(f"grid values of shape (n, {self.size}, {self.key_width}) expected, got {y.shape}")
        return y

    def _round_one(self, party: int, y: np.ndarray, extras: np.ndarray, ch: "Challenges") -> tuple[np.ndarray, np.ndarray]:
        if self.payload.scored:  # (a calibration check's challenges: `CalibrationChallenges`)
            return _calibration_round_one(party, y, _u64(extras), cast(CalibrationChallenges, ch))
        z, big_l, top = sketch.sketch(y, ch.wz, ch.wl, np.uint64(1 if party == 0 else 0))
        a = _u64(extras)[:, 0]
        msg = np.stack([F.sub(z, a), top], axis=1)
        return msg, np.stack([big_l, F.mul(top, np.full_like(top, ch.s))], axis=1)

    def round_one(self, party: int, y: np.ndarray, extras: np.ndarray, ch: "Challenges") -> tuple[np.ndarray, np.ndarray]:
        """(message (n, 2): e_b = z_b - a_b and top_b; state (n, 2): L_b and s * top_b), where
        z_b = sum_i r_i D_b,i and L_b = sum_i r_i^2 D_b,i are taken on y_b with the folded weights.
        calibration: message (n, CALIBRATION_OPENED), state (n, 3) (`_calibration_round_one`).
        With a MAC, y carries (y, kappa y) and the state also this server's share of kappa times each
        opened element (`Mac`): the same affine map on (kappa y_b, kappa x_b), its constant scaled
        by kappa_b."""
        return self._round_one_mac(party, y, extras, ch, False)[:2]

    def round_one_sums(self, party: int, y: np.ndarray, extras: np.ndarray, ch: "Challenges") -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """`round_one` and this server's share of the reports' histogram, the column sums of their
        values ((size, width), mod p, without the MAC tags), in one pass over y (what a server runs on
        each batch of reports, `round_one.step`); the same bits as `round_one` and `sketch.column_sums`."""
        return cast("tuple[np.ndarray, np.ndarray, np.ndarray]", self._round_one_mac(party, y, extras, ch, True))  # (with the sums)

    def _round_one_mac(self, party: int, y: np.ndarray, extras: np.ndarray, ch: "Challenges",
                       sums: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        y, extras = self._y(y), _u64(extras)
        w, xs = self.width, self.base_extras
        if self.mac and not self.payload.scored:  # count, label: one kernel reads values and tags in place
            total = np.zeros(self.size * w if sums else 0, np.uint64)
            z, big_l, top, zt, topt = sketch.sketch_mac(y, w, ch.wz, ch.wl, np.uint64(1 if party == 0 else 0), total)
            msg, state = self.mac_messages(z, big_l, top, zt, topt, extras, ch)
            return msg, state, total.reshape(self.size, w) if sums else None
        msg, state = self._round_one(party, np.ascontiguousarray(y[:, :, :w]), extras[:, :xs], ch)
        if self.mac:
            linear, _ = self._round_one(1, np.ascontiguousarray(y[:, :, w:]), extras[:, xs:2 * xs], ch)  # no constant
            state = self._tagged(state, linear, extras, ch)
        return msg, state, sketch.value_sums(y, w) if sums else None

    def calibration_mac_messages(self, party: int, dots: np.ndarray, last: np.ndarray, extras: np.ndarray,
                                 ch: "CalibrationChallenges") -> tuple[np.ndarray, np.ndarray]:
        """The MAC'd calibration round one (message, state) from `round_one.pass_sums`' sketch: dots (n, 6)
        the values' z, L, w, u and the tags' z, w; last (n, 6) the last grid point's values and tags;
        the same bits as `round_one_sums` on the grid values (the tags' L and u enter only a state
        this round drops)."""
        extras, xs = _u64(extras), self.base_extras
        msg, state = calibration_from_sums(party, dots[:, :4], last[:, :3], extras[:, :xs], ch)
        zero = np.zeros(dots.shape[0], np.uint64)
        tags = np.stack([dots[:, 4], zero, dots[:, 5], zero], axis=1)
        linear, _ = calibration_from_sums(1, tags, last[:, 3:6], extras[:, xs:2 * xs], ch)
        return msg, self._tagged(state, linear, extras, ch)

    def mac_messages(self, z: np.ndarray, big_l: np.ndarray, top: np.ndarray, zt: np.ndarray, topt: np.ndarray,
                     extras: np.ndarray, ch: "Challenges") -> tuple[np.ndarray, np.ndarray]:
        """The MAC'd count/label round one (message, state) from a report's sketch (`sketch.sketch_mac`'s
        z, l, top of the values, zt, topt of the tags, each (n,) canonical) and its extras."""
        extras, xs = _u64(extras), self.base_extras
        msg = np.stack([F.sub(z, extras[:, 0]), top], axis=1)
        state = np.stack([big_l, F.mul(top, np.full_like(top, ch.s))], axis=1)
        linear = np.stack([F.sub(zt, extras[:, xs]), topt], axis=1)  # the tags' round one, no constant
        return msg, self._tagged(state, linear, extras, ch)

    def _tagged(self, state: np.ndarray, linear: np.ndarray, extras: np.ndarray, ch: "Challenges") -> np.ndarray:
        """The state with this server's share of kappa times each opened element appended: the tags'
        round one (`linear`) plus kappa_b times the opening's constant (`Mac`)."""
        tagged = F.add(linear, F.mul(extras[:, 2 * self.base_extras][:, None], self._constant(ch)[None, :]))
        return np.column_stack([state, tagged])

    def _constant(self, ch: "Challenges") -> np.ndarray:
        """c = the constant part of the opened elements (server 0's round one on zero shares)."""
        zeros = np.zeros((1, self.size, self.width), np.uint64)
        return self._round_one(0, zeros, np.zeros((1, self.base_extras), np.uint64), ch)[0][0]

    def mac_values(self, party: int, state: np.ndarray, opened: np.ndarray, extras: np.ndarray) -> np.ndarray:
        """sigma_b = kappa_b * opened - [kappa * opened]_b, (n, opened): the two servers' sigmas add up
        to 0 exactly when the opened elements are what the shares say (`Mac`)."""
        k = _u64(extras)[:, 2 * self.base_extras]
        tagged = _u64(state)[:, -self.opened:]
        return F.sub(F.mul(_u64(opened), k[:, None]), tagged)

    def round_two(self, party: int, state: np.ndarray, opened: np.ndarray, extras: np.ndarray) -> np.ndarray:
        """V_b = [b = 0] e^2 + 2 e a_b + A_b - L_b + s top_b (`second_message`): (n,).
        calibration: (n, 3), the three sub-checks' V_b (`_calibration_round_two`)."""
        if self.mac:
            state, extras = _u64(state)[:, :-self.opened], _u64(extras)[:, :self.base_extras]
        if self.payload.scored:
            return _calibration_round_two(party, _u64(state), _u64(opened), _u64(extras))
        e, x = _u64(opened)[:, 0], _u64(extras)
        sq = F.add(F.mul(F.add(e, e), x[:, 0]), x[:, 1])
        if party == 0:
            sq = F.add(sq, F.mul(e, e))
        return F.add(F.sub(sq, state[:, 0]), state[:, 1])

    def verdicts(self, opened: np.ndarray, v: np.ndarray, mac_ok: np.ndarray | None = None) -> np.ndarray:
        """The verdicts (below); with `mac_ok` (bool (n,)), MAC first where it is False: its other
        values were never computed (`Mac`)."""
        out = self._verdicts(opened, v)
        return out if mac_ok is None else np.where(mac_ok, out, MAC).astype(np.uint8)

    def _verdicts(self, opened: np.ndarray, v: np.ndarray) -> np.ndarray:
        """Per report: OK (0), WEIGHT if the opened top is not 0, else SHAPE if V is not 0 (uint8).
        calibration (v of shape (n, 3): V of the unit/label, score and range sub-checks): WEIGHT if
        top is not 0, else SHAPE if the unit/label or the score check fails, else RANGE if the range
        check fails; a report counts iff top = 0 and all three V are 0."""
        top, v = _u64(opened)[:, 1], _u64(v)
        if self.payload.scored:
            shape = (v[:, 0] != 0) | (v[:, 1] != 0)
            return np.select([top != 0, shape, v[:, 2] != 0], [WEIGHT, SHAPE, RANGE], OK).astype(np.uint8)
        return np.where(top != 0, WEIGHT, np.where(v != 0, SHAPE, OK)).astype(np.uint8)


class Challenges:
    """The challenges of one close folded into weights on the grid values: with r_{i,c} the challenge
    of D's entry i of component c (r_N = 0), wz[i, c] = r_i - r_{i+1} and wl[i, c] = r_i^2 - r_{i+1}^2,
    so that sum_i r_i D_i = sum_i wz_i y_i (summation by parts) and likewise for L."""

    def __init__(self, wz: np.ndarray, wl: np.ndarray, s: int | np.integer | np.ndarray):
        self.wz, self.wl, self.s = wz, wl, np.uint64(s)

    @classmethod
    def fold(cls, r: np.ndarray, s: object, size: int, width: int) -> "Challenges":
        r = _u64(r).reshape(width, size).T  # component c's challenges are r[c*size : (c+1)*size]
        nxt = np.zeros_like(r)
        nxt[:-1] = r[1:]
        r2, nxt2 = F.mul(r, r), F.mul(nxt, nxt)
        return cls(np.ascontiguousarray(F.sub(r, nxt)), np.ascontiguousarray(F.sub(r2, nxt2)), _u64(s))


def _fold_weights(c: np.ndarray) -> np.ndarray:
    """Weights c_i on the differences D_i = y_i - y_{i-1} -> weights c_i - c_{i+1} (c_N = 0) on y_i
    (summation by parts), along axis 0."""
    nxt = np.zeros_like(c)
    nxt[:-1] = c[1:]
    return F.sub(c, nxt)


class CalibrationChallenges(Challenges):
    """The challenges of a calibration close, all from one SHAKE-128 stream (`challenges` with length
    3N + 1 + 2 BITS, sliced): r (2N) and s for the unit/label sketch, rho (N) for the score check,
    sigma and one pair (r_j0, r_j1) per bit for the range check. Kept raw (r, s, rho, sigma, rbits)
    and folded: wz, wl (N, 2) the unit/label sketch's weights on y^(0), y^(1) (the vector
    (D^(1), D^(0) - D^(1)) puts r_{N+i} on D^(0)_i and r_i - r_{N+i} on D^(1)_i), w (N, 5) the
    kernel's columns (wz, wl, folded rho), and the bits' u_j = bit_u0 + bit_u1 b_j,
    L_j = bit_l0 + bit_l1 b_j."""

    @classmethod
    def derive(cls, key: bytes, context: bytes, size: int) -> "CalibrationChallenges":
        vals, s = challenges(key, context, 3 * size + 1 + 2 * BITS)
        return cls(vals[: 2 * size], s, vals[2 * size : 3 * size], vals[3 * size], vals[3 * size + 1 :].reshape(BITS, 2))

    def __init__(self, r: np.ndarray, s: int | np.integer | np.ndarray, rho: np.ndarray, sigma: int | np.integer | np.ndarray,
                 rbits: np.ndarray):
        r, rho, rbits = _u64(r), _u64(rho), _u64(rbits)
        size = rho.shape[0]
        self.r, self.rho, self.sigma, self.rbits = r, rho, np.uint64(sigma), rbits
        c0, c1 = r[size:], F.sub(r[:size], r[size:])
        l0 = F.mul(c0, c0)
        l1 = F.sub(F.mul(r[:size], r[:size]), l0)
        wz = _fold_weights(np.stack([c0, c1], axis=1))
        wl = _fold_weights(np.stack([l0, l1], axis=1))
        super().__init__(np.ascontiguousarray(wz), np.ascontiguousarray(wl), _u64(s))
        self.w = np.ascontiguousarray(np.column_stack([wz, wl, _fold_weights(rho)]))
        r0, r1 = rbits[:, 0], rbits[:, 1]
        self.bit_u0, self.bit_u1 = r1, F.sub(r0, r1)
        self.bit_l0 = F.mul(r1, r1)
        self.bit_l1 = F.sub(F.mul(r0, r0), self.bit_l0)


def _calibration_round_one(party: int, y: np.ndarray, x: np.ndarray, ch: CalibrationChallenges) -> tuple[np.ndarray, np.ndarray]:
    """Server `party`'s round one of a calibration check: y (n, N, 3), x (n, CALIBRATION_EXTRAS).

    Local (linear) shares: z, L of the unit/label sketch, w = sum_i rho_i D^(0)_i and
    u = sum_i rho_i D^(2)_i (the numba kernel, six multiplications per grid point), top = 1 - y^(0)_{N-1},
    q = y^(2)_{N-1}, and per bit u_j, L_j. Message (n, 21): z - a, top, q - a', w - b', u_j - a_j.
    State (n, 3): s * top - L, u, and sigma (q - sum_j w_j b_j) - sum_j L_j."""
    return calibration_from_sums(party, sketch.sketch_calibration(y, ch.w), y[:, -1], x, ch)


def calibration_from_sums(party: int, sums: np.ndarray, last: np.ndarray, x: np.ndarray,
                          ch: CalibrationChallenges) -> tuple[np.ndarray, np.ndarray]:
    """`_calibration_round_one` from its linear sketch: sums (n, 4) the weighted sums z, L, w, u of
    `sketch.sketch_calibration` (or of `DCF.eval_grid_sums`, `round_one.pass_sums`), last (n, 3) the
    last grid point's values; the same bits."""
    z, big_l, w, u = sums[:, 0], sums[:, 1], sums[:, 2], sums[:, 3]
    n = sums.shape[0]
    top = F.sub(np.full(n, 1 if party == 0 else 0, np.uint64), np.ascontiguousarray(last[:, 0]))
    q = np.ascontiguousarray(last[:, 2])
    bits = x[:, X_BITS]
    uj = F.mul(bits, ch.bit_u1[None, :])
    lj = F.mul(bits, ch.bit_l1[None, :])
    if party == 0:  # the constant parts of u_j = r_j1 + (r_j0 - r_j1) b_j and of L_j
        uj, lj = F.add(uj, ch.bit_u0[None, :]), F.add(lj, ch.bit_l0[None, :])
    msg = np.empty((n, CALIBRATION_OPENED), np.uint64)
    msg[:, 0] = F.sub(z, x[:, 0])
    msg[:, 1] = top
    msg[:, 2] = F.sub(q, x[:, 2])
    msg[:, 3] = F.sub(w, x[:, 3])
    msg[:, 4:] = F.sub(uj, x[:, X_BIT_A])
    lin = F.sub(q, F.dot(bits, RANGE_WEIGHTS[None, :]))
    state = np.empty((n, 3), np.uint64)
    state[:, 0] = F.sub(F.mul(top, np.full(n, ch.s, np.uint64)), big_l)
    state[:, 1] = u
    state[:, 2] = F.sub(F.mul(lin, np.full(n, ch.sigma, np.uint64)), F.sum(lj, axis=1))
    return msg, state


def _calibration_round_two(party: int, state: np.ndarray, opened: np.ndarray, x: np.ndarray) -> np.ndarray:
    """Server `party`'s three check values (n, 3), each a share of a square or product rebuilt from
    the opened masked value (for any m and opened e = v - m: v^2 = e^2 + 2 e m + m^2, and
    v v' = d f + d b' + f a' + a' b' with d = v - a', f = v' - b'):

        V1_b = [b = 0] e^2 + 2 e a_b + A_b + s top_b - L_b
        V2_b = u_b - ([b = 0] d f + d b'_b + f a'_b + c'_b)            d = q - a', f = w - b'
        V3_b = sigma (q_b - sum_j w_j b_j,b) + sum_j ([b = 0] e_j^2 + 2 e_j a_j,b + A_j,b - L_j,b)"""
    e, d, f, ej = opened[:, 0], opened[:, 2], opened[:, 3], opened[:, 4:]
    out = np.empty((state.shape[0], 3), np.uint64)
    sq = F.add(F.mul(F.add(e, e), x[:, 0]), x[:, 1])
    prod = F.add(F.add(F.mul(d, x[:, 3]), F.mul(f, x[:, 2])), x[:, 4])
    sqj = F.add(F.mul(F.add(ej, ej), x[:, X_BIT_A]), x[:, X_BIT_AA])
    if party == 0:
        sq = F.add(sq, F.mul(e, e))
        prod = F.add(prod, F.mul(d, f))
        sqj = F.add(sqj, F.mul(ej, ej))
    out[:, 0] = F.add(sq, state[:, 0])
    out[:, 1] = F.sub(state[:, 1], prod)
    out[:, 2] = F.add(state[:, 2], F.sum(sqj, axis=1))
    return out
