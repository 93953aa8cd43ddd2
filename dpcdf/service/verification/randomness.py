"""The field elements of the report check that are not the check itself: the challenges both
servers derive from their shared key (`challenges`), and what an honest client draws per report
(its pair (a, a^2), a calibration report's extras with q's range bits), with the layout of those
extras (the X_* columns). Pure functions over F_p of `fss.field` (p = 2^61 - 1) on numpy arrays;
`maths.Check` runs the check on them, `reference` is the textbook copy the tests compare it with."""
from __future__ import annotations

import hashlib
import secrets

import numpy as np

from fss import field as F

P = F.P
DOMAIN = b"fss-dpcdf/verify/challenges/v1"
QMAX = 1 << 16  # a calibration report's q is an integer in [0, QMAX]: a probability in units of 2^-16


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


# --- calibration reports (1, label, q): the client's extras ----------------------------
def range_weights(bound: int) -> list[int]:
    """The weights of the range check of q in [0, bound]: 1, 2, .., 2^(m-1), bound - (2^m - 1) with
    2^m <= bound < 2^(m+1). The sums sum_j w_j b_j over bits b in {0, 1}^(m+1) are exactly the
    integers 0 .. bound (the first m weights give 0 .. 2^m - 1, the last one shifts that range up by
    at most 2^m), so no bound check beyond the bits is needed. bound = 2^16: 1, 2, .., 2^15, 1."""
    bound = int(bound)
    if bound < 1:
        raise ValueError(f"the range bound must be at least 1, got {bound}")
    m = bound.bit_length() - 1
    return [1 << j for j in range(m)] + [bound - ((1 << m) - 1)]


RANGE_WEIGHTS = np.array(range_weights(QMAX), dtype=np.uint64)  # 1, 2, .., 2^15, 1
BITS = len(RANGE_WEIGHTS)  # 17
# The calibration extras, per server and report (columns of `calibration_extras`):
X_PAIR = slice(0, 2)  # (a, A = a^2): the unit/label sketch's pair
X_TRIPLE = slice(2, 5)  # (a', b', c' = a' b'): Beaver triple for q * sum_i rho_i D^(0)_i
X_BITS = slice(5, 5 + BITS)  # b_0 .. b_16 with q = sum_j w_j b_j
X_BIT_A = slice(5 + BITS, 5 + 2 * BITS)  # a_j: one pair (a_j, a_j^2) per bit, for its unit-vector check
X_BIT_AA = slice(5 + 2 * BITS, 5 + 3 * BITS)  # A_j = a_j^2
CALIBRATION_EXTRAS = 5 + 3 * BITS  # 56
# opened in round one: e = z - a, top, q - a', sum_i rho_i D^(0)_i - b', and e_j = u_j - a_j per bit
CALIBRATION_OPENED = 4 + BITS  # 21
_SECRETS = 3 + BITS  # the client's uniform secrets per report: a, a', b', a_0 .. a_16
CALIBRATION_RANDOMNESS = 16 * (_SECRETS + CALIBRATION_EXTRAS)  # bytes per report: 1216


def _elements(x: object) -> np.ndarray:
    """Integers of any sign and size (or canonical uint64 elements) -> canonical elements."""
    arr = np.asarray(x)
    if arr.dtype.kind in "ui" and (arr.size == 0 or (arr.min() >= 0 and arr.max() < P)):
        return arr.astype(np.uint64)
    return F.from_ints(np.asarray(x, dtype=object))


def range_bits(q: object, bound: int = QMAX) -> np.ndarray:
    """An honest client's bits of integers q in [0, bound] for `range_weights(bound)`: the last bit is
    1 iff q >= 2^m, the others are the binary digits of what remains. (n,) -> (n, m + 1) uint64."""
    q = np.asarray(q, dtype=np.int64)
    if q.size and (q.min() < 0 or q.max() > bound):
        raise ValueError(f"q must be in [0, {bound}]")
    w = range_weights(bound)
    m = len(w) - 1
    last = (q >= (1 << m)).astype(np.int64)
    rest = q - w[-1] * last
    digits = (rest[..., None] >> np.arange(m, dtype=np.int64)) & 1
    return np.concatenate([digits, last[..., None]], axis=-1).astype(np.uint64)


def calibration_extras(
    bits: object,
    randomness: bytes | None = None,
    *,
    pair_error: object = 0,
    triple_error: object = 0,
    bit_pair_errors: object = 0,
) -> tuple[np.ndarray, np.ndarray]:
    """The additive shares ((n, 56), (n, 56)) of a calibration report's extras with the claimed bits
    given explicitly: bits (n, BITS), any integers (taken mod p). An honest client passes
    `range_bits(q)` (`Check.client_extras` does); a client crafting a malformed report may claim
    anything, and may also err in its correlated randomness: `pair_error` = A - a^2,
    `triple_error` = c' - a' b' (per report) and `bit_pair_errors` = A_j - a_j^2 (per report and bit),
    all 0 for an honest client. Columns: X_PAIR, X_TRIPLE, X_BITS, X_BIT_A, X_BIT_AA. The secrets a,
    a', b', a_j are uniform; server 0's shares are uniform, server 1's the difference.
    `randomness`: CALIBRATION_RANDOMNESS bytes per report (the OS CSPRNG if None)."""
    bits = _elements(bits)
    if bits.ndim != 2 or bits.shape[1] != BITS:
        raise ValueError(f"bits of shape (n, {BITS}) expected, got {bits.shape}")
    n = bits.shape[0]
    count = _SECRETS + CALIBRATION_EXTRAS
    data = secrets.token_bytes(16 * count * n) if randomness is None else randomness
    vals = elements_from_bytes(data, count * n).reshape(n, count) if n else np.zeros((0, count), np.uint64)
    a, ta, tb, aj = vals[:, 0], vals[:, 1], vals[:, 2], vals[:, 3:_SECRETS]
    x0 = vals[:, _SECRETS:]
    x = np.empty((n, CALIBRATION_EXTRAS), np.uint64)
    x[:, 0] = a
    x[:, 1] = F.add(F.mul(a, a), np.broadcast_to(_elements(pair_error), (n,)))
    x[:, 2], x[:, 3] = ta, tb
    x[:, 4] = F.add(F.mul(ta, tb), np.broadcast_to(_elements(triple_error), (n,)))
    x[:, X_BITS] = bits
    x[:, X_BIT_A] = aj
    x[:, X_BIT_AA] = F.add(F.mul(aj, aj), np.broadcast_to(_elements(bit_pair_errors), (n, BITS)))
    return x0, F.sub(x, x0)
