"""Gates on masked inputs: comparison, interval containment and ReLU, each from one DCF key.

The setting is the FSS gate of Boyle, Chandran, Gilboa, Gupta, Ishai, Kumar, Rathee (Eurocrypt 2021,
eprint 2020/1392). A value x of Z_N, N = 2^bits, is held masked: both parties see x_hat = x + r_in
mod N, and only the dealer knows the uniform mask r_in. Offline the dealer runs `gen(r_in, r_out)`
and gives key k_b to party b; online each party computes `eval(k_b, x_hat)` alone, and the two
results add up to g(x) + r_out in the output group (Z_{2^out_bits}, or F_p with `group="p61"`,
p = 2^61 - 1). The output mask r_out hides g(x) from whoever sees both shares; the protocol around
the gate removes it (or keeps it as the next gate's r_in). One key pair serves one x_hat: a second
masked value under the same r_in would reveal the difference of the two values.

Formulation (the paper's interval containment, section 4.1 and Fig. 14, the multiple interval
containment gate: one DCF key, two evaluations per interval). With D the DCF of z -> [z < r_in]
(payload 1) and arguments taken mod N, for every public c in [0, N]:

    [x < c] = [x_hat < c] - D(x_hat) + D(x_hat - c)

(by cases: x_hat < c or not, and x_hat < r_in or not, i.e. whether x + r_in wrapped past N; each of
the four cases makes both sides equal). Hence for 0 <= lo <= hi <= N the D(x_hat) terms cancel:

    [lo <= x < hi] = [lo <= x_hat < hi] + D(x_hat - hi) - D(x_hat - lo)

The first term is public (party 0 adds it), the others are the parties' DCF shares, and a share of
r_out completes the output. The paper puts its DCF threshold at r_in - 1 and evaluates at x_hat - 1 -
p, which leaves a correction term that depends on r_in in the key; at r_in itself the correction is
the public [lo <= x_hat < hi] above, so a key here is the DCF key and the shares of the masks only.
The key does not depend on the interval: `MultiIntervalGate` answers m intervals from one DCF key
(2m evaluations), as Fig. 14 does. Signed inputs (two's complement) are compared after adding N/2
to the bounds and to x_hat, which keeps the order.

Security: party b's key is a DCF key for the threshold r_in (payload 1; for ReLU the vector (1, r_in))
and party b's additive shares of r_out (and of r_in for ReLU). By the DCF's security (Fig. 1,
computational, from the PRG: `fss.prg`) the DCF key alone is simulated from the public parameters
(bits, the output group, the width), and the mask shares are uniform and independent of it (party 0's
is drawn fresh; exactly uniform in Z_{2^k}, within 2^-122 of uniform in F_p: 16 bytes reduced mod p,
`fss.field`). So each key alone reveals nothing about r_in or r_out beyond the public parameters; the
two keys together reveal both. Randomness comes from the OS CSPRNG (`secrets`); `_gen_with_randomness`
is the deterministic path of the known-answer vectors only, as for the DCF.
"""
from __future__ import annotations

import secrets
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Sequence, Union, cast

from ._lazy import numpy as _numpy

from . import inputs
from .dcf import DCF
from .errors import KeyMismatchError, ParameterError
from .function import ROOT_BYTES
from .keys import Key, KeyBatch
from .params import check_int

if TYPE_CHECKING:
    import numpy as np
    from numpy.typing import ArrayLike
else:
    np = _numpy(__name__)  # numpy at first use (`fss._lazy`)

SHARE_BYTES = 16  # randomness per mask share: a 128-bit little-endian integer, taken mod the group's order
Output = Union[int, tuple]


@dataclass(frozen=True, eq=False)
class GateKeyBatch:
    """n gate keys of one party: the DCF keys (`dcf`) and this party's shares of the masks, a uint64
    array (n, s) in the output group (the m output masks, then for ReLU the share of r_in). `gate`
    names the gate the keys were made for; evaluating them with another gate is a KeyMismatchError."""

    gate: str
    party: int
    dcf: KeyBatch
    shares: np.ndarray

    def __len__(self) -> int:
        return self.dcf.n

    def __getitem__(self, i: int) -> "GateKey":
        if isinstance(i, bool) or not isinstance(i, (int, np.integer)):
            raise ParameterError(f"a GateKeyBatch is indexed by an int, got {type(i).__name__}")
        key = self.dcf[i]  # KeyIndexError out of range
        j = int(i) % self.dcf.n
        return GateKey(GateKeyBatch(self.gate, self.party, key.batch, self.shares[j:j + 1].copy()))

    def __repr__(self) -> str:
        return f"GateKeyBatch({self.gate}, party={self.party}, n={len(self)})"


@dataclass(frozen=True, eq=False)
class GateKey:
    """One party's key for one gate evaluation: a `GateKeyBatch` of one."""

    batch: GateKeyBatch

    @property
    def party(self) -> int:
        return self.batch.party

    @property
    def dcf_key(self) -> Key:
        return Key(self.batch.dcf)

    @property
    def shares(self) -> tuple:
        return tuple(int(v) for v in self.batch.shares[0])

    def __repr__(self) -> str:
        return f"GateKey({self.batch.gate}, party={self.party})"


class _MaskedGate:
    """What every gate shares: the DCF of [z < r_in], the masks' shares, gen and eval plumbing."""

    _outputs = 1  # m: output values (and output masks) per evaluation
    _width = 1  # the DCF's payload width

    def _setup(self, bits: int, out_bits: int | None, group: str) -> None:
        bits = check_int("bits", bits, 1, 64)
        if out_bits is None and group == "ring":
            out_bits = bits
        self.dcf = DCF(bits, out_bits, self._width, cmp="lt", group=group)
        self.params = self.dcf.params

    # --- public parameters --------------------------------------------------------------------
    @property
    def bits(self) -> int:
        return self.params.bits

    @property
    def out_bits(self) -> int:
        return self.params.out_bits

    @property
    def group(self) -> str:
        return self.params.group

    @property
    def modulus(self) -> int:
        """Order of the output group: 2^out_bits, or p = 2^61 - 1."""
        return self.params.modulus

    @property
    def _shares(self) -> int:
        return self._outputs

    def reconstruct(self, share0: object, share1: object, signed: bool = False) -> object:
        """share0 + share1 in the output group (ints, tuples or arrays; `DCF.reconstruct`): g(x) + r_out."""
        return self.dcf.reconstruct(share0, share1, signed)

    # --- masks and gen -------------------------------------------------------------------------
    def random_masks(self, n: int | None = None) -> tuple[object, object]:
        """Fresh (r_in, r_out) from the OS CSPRNG: ints (r_out a tuple of m for m > 1 outputs), or with
        `n` uint64 arrays (n,) and (n,) or (n, m). r_in is uniform on Z_{2^bits}; r_out uniform on the
        output group (within 2^-122 for F_p)."""
        count = 1 if n is None else check_int("n", n, 0, 1 << 40)
        words = np.frombuffer(secrets.token_bytes(8 * count), "<u8").astype(np.uint64)
        r_in = words & np.uint64(self.params.domain_mask)
        r_out = self._uniform(secrets.token_bytes(SHARE_BYTES * count * self._outputs), (count, self._outputs))
        if n is not None:
            return r_in, (r_out[:, 0].copy() if self._outputs == 1 else r_out)
        outs = tuple(int(v) for v in r_out[0])
        return int(r_in[0]), (outs[0] if self._outputs == 1 else outs)

    def gen(self, r_in: int, r_out: object) -> tuple[GateKey, GateKey]:
        """Both parties' keys for input mask r_in (an int in [0, 2^bits)) and output mask r_out (an int
        in [0, modulus), or m of them for m outputs). Randomness from the OS CSPRNG. ParameterError
        for a mask out of range."""
        return self._gen_with_randomness(r_in, r_out, secrets.token_bytes(self._random_bytes(1)))

    def _gen_with_randomness(self, r_in: int, r_out: object, randomness: bytes) -> tuple[GateKey, GateKey]:
        """Deterministic gen (tests and vectors only): `randomness` as for `_gen_batch_with_randomness`, n = 1."""
        r_in = check_int("r_in", r_in, 0, self.params.domain_mask)
        outs = [r_out] if self._outputs == 1 else list(self._sequence(r_out))
        k0, k1 = self._gen_batch_with_randomness(np.array([r_in], np.uint64), np.array([outs], dtype=object), randomness)
        return GateKey(k0), GateKey(k1)

    def gen_batch(self, r_in: ArrayLike, r_out: ArrayLike) -> tuple[GateKeyBatch, GateKeyBatch]:
        """Key pairs for n masks at once: r_in n ints in [0, 2^bits), r_out n ints in [0, modulus) (or an
        (n, m) array for m outputs). Returns one `GateKeyBatch` per party."""
        n = int(np.size(r_in))
        return self._gen_batch_with_randomness(r_in, r_out, secrets.token_bytes(self._random_bytes(n)))

    def _random_bytes(self, n: int) -> int:
        return n * (ROOT_BYTES + SHARE_BYTES * self._shares)

    def _gen_batch_with_randomness(self, r_in: object, r_out: object, randomness: bytes) -> tuple[GateKeyBatch, GateKeyBatch]:
        """Deterministic batch gen: `randomness` is the DCF's 32 bytes per key (its two root seeds),
        then per key, per mask share, 16 bytes that make party 0's share (party 1's is the mask minus it)."""
        p = self.params
        r = inputs._int_array(r_in, 0, p.domain_mask, "r_in")
        if r.ndim != 1:
            raise ParameterError(f"r_in must be one-dimensional, got shape {r.shape}")
        n, m = r.shape[0], self._outputs
        outs = inputs._int_array(r_out, 0, p.modulus - 1, "r_out")
        if outs.shape != ((n,) if m == 1 and outs.ndim == 1 else (n, m)):
            raise ParameterError(f"r_out of shape {outs.shape} does not fit {n} keys of {m} output(s)")
        if not isinstance(randomness, (bytes, bytearray)) or len(randomness) != self._random_bytes(n):
            raise ParameterError(f"need {self._random_bytes(n)} bytes of randomness for {n} gate keys")
        d0, d1 = self.dcf._gen_batch_with_randomness(r, self._payload(r), bytes(randomness[: ROOT_BYTES * n]))
        values = self._values(r, outs.reshape(n, m))
        s0 = self._uniform(bytes(randomness[ROOT_BYTES * n:]), (n, self._shares))
        _, sub, _, _ = self._ops()
        name = repr(self)
        return GateKeyBatch(name, 0, d0, s0), GateKeyBatch(name, 1, d1, sub(values, s0))

    def _uniform(self, data: bytes, shape: tuple[int, int]) -> np.ndarray:
        """Group elements from 16 bytes each: the low word mod 2^out_bits, or the 128 bits mod p."""
        words = np.frombuffer(data, "<u8").astype(np.uint64).reshape(*shape, 2)
        if self.params.prime:
            from . import field

            return field.reduce128(words[..., 0], words[..., 1])
        return words[..., 0] & np.uint64(self.params.mask)

    def _payload(self, r: np.ndarray) -> object:
        return 1

    def _values(self, r: np.ndarray, outs: np.ndarray) -> np.ndarray:
        """The secrets each key pair shares additively: (n, s) in the output group."""
        return outs

    @staticmethod
    def _sequence(values: object, what: str = "r_out of a gate of several outputs") -> Sequence:
        if isinstance(values, (str, bytes)) or not hasattr(values, "__len__"):
            raise ParameterError(f"{what} must be a sequence, got {type(values).__name__}")
        return cast(Sequence, values)  # one with a length: indexed and listed as a sequence

    # --- eval ----------------------------------------------------------------------------------
    def eval(self, key: GateKey, x_hat: int) -> Output:
        """This party's share of g(x) + r_out at the masked input x_hat = x + r_in mod 2^bits (an int in
        [0, 2^bits)): an int in the output group, or a tuple of m for m outputs."""
        if not isinstance(key, GateKey):
            raise ParameterError(f"expected a GateKey, got {type(key).__name__}")
        x = check_int("x_hat", x_hat, 0, self.params.domain_mask)
        row = self._eval(key.batch, np.array([x], np.uint64))[0]
        return int(row[0]) if self._outputs == 1 else tuple(int(v) for v in row)

    def eval_batch(self, keys: GateKeyBatch, x_hat: object) -> np.ndarray:
        """Key k's share at x_hat[k], for every key: uint64 array (n,), or (n, m) for m outputs."""
        if not isinstance(keys, GateKeyBatch):
            raise ParameterError(f"expected a GateKeyBatch, got {type(keys).__name__}")
        x = inputs._int_array(x_hat, 0, self.params.domain_mask, "x_hat")
        if x.shape != (len(keys),):
            raise ParameterError(f"eval_batch needs one x_hat per key: {len(keys)} keys, x_hat of shape {x.shape}")
        out = self._eval(keys, x)
        return out[:, 0].copy() if self._outputs == 1 else out

    def _eval(self, keys: GateKeyBatch, x: np.ndarray) -> np.ndarray:
        if keys.gate != repr(self):
            raise KeyMismatchError(f"keys of {keys.gate} used with {self!r}")
        mask = np.uint64(self.params.domain_mask)

        def dcf_at(points: np.ndarray) -> np.ndarray:
            return self.dcf.eval_batch(keys.dcf, points & mask)

        return self._combine(keys.party, x, dcf_at, keys.shares)

    def _combine(self, party: int, x: np.ndarray, dcf_at: Callable, shares: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def _ops(self) -> tuple[Callable, Callable, Callable, Callable]:
        """add, sub, mul and reduce (any uint64 -> canonical) in the output group, on uint64 arrays."""
        if self.params.prime:
            from . import field

            return field.add, field.sub, field.mul, field.reduce64
        m = np.uint64(self.params.mask)
        return (lambda a, b: (a + b) & m), (lambda a, b: (a - b) & m), (lambda a, b: (a * b) & m), (lambda a: a & m)

    def _describe(self, name: str, fields: str) -> str:
        group = ", group=p61" if self.params.prime else f", out_bits={self.out_bits}"
        return f"{name}(bits={self.bits}{fields}{group})"


class MultiIntervalGate(_MaskedGate):
    """Multiple interval containment (BCG+21 section 4.1, Fig. 14): shares of [p_j <= x <= q_j] + r_out_j
    for m public intervals, all from one DCF key (2m DCF evaluations). x is in [0, 2^bits), or with
    `signed=True` in [-2^(bits-1), 2^(bits-1)) (two's complement; x_hat is still x + r_in mod
    2^bits, in [0, 2^bits)). Output in Z_{2^out_bits} (default out_bits = bits) or, with
    group="p61", in F_p. ParameterError for bounds outside the domain or p_j > q_j."""

    def __init__(self, bits: int, intervals: Sequence[tuple[int, int]], out_bits: int | None = None, *,
                 signed: bool = False, group: str = "ring"):
        self._setup(bits, out_bits, group)
        if not isinstance(signed, bool):
            raise ParameterError(f"signed must be a bool, got {type(signed).__name__}")
        self.signed = signed
        lo, hi = self._domain()
        pairs = list(_MaskedGate._sequence(intervals, "intervals"))
        if not pairs:
            raise ParameterError("a gate needs at least one interval")
        bounds = []
        for j, pq in enumerate(pairs):
            if not isinstance(pq, (tuple, list)) or len(pq) != 2:
                raise ParameterError(f"interval {j} must be a pair (p, q), got {pq!r}")
            p = check_int("p", pq[0], lo, hi)
            q = check_int("q", pq[1], lo, hi)
            if p > q:
                raise ParameterError(f"interval {j}: p = {p} > q = {q}")
            bounds.append((p, q + 1))
        self._set_bounds(bounds, f", intervals={[(p, h - 1) for p, h in bounds]}")

    def _domain(self) -> tuple[int, int]:
        n = self.params.bits
        return (-(1 << (n - 1)), (1 << (n - 1)) - 1) if self.signed else (0, (1 << n) - 1)

    def _set_bounds(self, bounds: list[tuple[int, int]], fields: str) -> None:
        """bounds: half-open [lo, hi) in the gate's (signed or unsigned) domain, lo <= hi."""
        self._offset = 1 << (self.bits - 1) if self.signed else 0
        self._bounds = [(lo + self._offset, hi + self._offset) for lo, hi in bounds]  # 0 <= lo <= hi <= 2^bits
        self._outputs = len(bounds)
        self._name = self._describe(type(self).__name__, fields + (", signed" if self.signed else ""))

    def __repr__(self) -> str:
        return self._name

    def _combine(self, party: int, x: np.ndarray, dcf_at: Callable, shares: np.ndarray) -> np.ndarray:
        add, sub, _, _ = self._ops()
        xs = (x + np.uint64(self._offset)) & np.uint64(self.params.domain_mask)
        out = np.empty((x.shape[0], self._outputs), np.uint64)
        for j, (lo, hi) in enumerate(self._bounds):
            y = add(sub(dcf_at(xs - np.uint64(hi & 0xFFFF_FFFF_FFFF_FFFF)), dcf_at(xs - np.uint64(lo))), shares[:, j])
            if party == 0 and hi > lo:  # the public term [lo <= x_hat < hi]
                y = add(y, ((xs >= np.uint64(lo)) & (xs <= np.uint64(hi - 1))).astype(np.uint64))
            out[:, j] = y
        return out


class IntervalGate(MultiIntervalGate):
    """Interval containment (DIF; BCG+21 section 4.1): shares of [p <= x <= q] + r_out for public
    p <= q in the domain, on the masked input; the wrap-around of x + r_in past 2^bits is exact. A
    `MultiIntervalGate` of one interval; same arguments otherwise."""

    def __init__(self, bits: int, p: int, q: int, out_bits: int | None = None, *, signed: bool = False, group: str = "ring"):
        super().__init__(bits, [(p, q)], out_bits, signed=signed, group=group)


class ComparisonGate(MultiIntervalGate):
    """The comparison gate: shares of [x < c] + r_out for a public constant c, as the paper derives
    comparison from interval containment (the interval [0, c - 1], or [-2^(bits-1), c - 1] signed),
    on the masked input x_hat = x + r_in mod 2^bits. c ranges over the domain and one past it
    (c = 2^bits, or 2^(bits-1) signed: always 1; c at the domain's least value: always 0). For
    [x >= c] take 1 - [x < c]: party 0 computes 1 - y_0, party 1 -y_1, and the mask becomes -r_out.
    Key: one DCF key and a share of r_out; eval: two DCF evaluations."""

    def __init__(self, bits: int, c: int, out_bits: int | None = None, *, signed: bool = False, group: str = "ring"):
        self._setup(bits, out_bits, group)
        if not isinstance(signed, bool):
            raise ParameterError(f"signed must be a bool, got {type(signed).__name__}")
        self.signed = signed
        lo, hi = self._domain()
        self.c = check_int("c", c, lo, hi + 1)
        self._set_bounds([(lo, self.c)], f", c={self.c}")


def sign_gate(bits: int, out_bits: int | None = None, *, group: str = "ring") -> IntervalGate:
    """[x >= 0] for x in two's complement (often called DReLU): the `IntervalGate` of [0, 2^(bits-1) - 1],
    signed. ReLU(x) = x * [x >= 0] then costs one multiplication of two shared values (a Beaver triple
    from the dealer, one round); `ReluGate` does without it."""
    return IntervalGate(bits, 0, (1 << (check_int("bits", bits, 1, 64) - 1)) - 1, out_bits, signed=True, group=group)


class ReluGate(_MaskedGate):
    """ReLU on a masked input: shares of ReLU(x) + r_out, ReLU(x) = max(x, 0) for x in two's complement
    on `bits` bits, as an integer in the output group (exact when it fits: out_bits >= bits - 1, or
    bits <= 61 over F_p; else reduced mod the group's order). No multiplication triple: the paper's
    way to splines (a DCF whose payload is a vector of coefficients that fold in r_in) for one degree-1
    piece: a DCF with the payload vector (1, r_in), and shares of r_in. With s = [x >= 0] =
    [x_hat < N/2] - D(x_hat) + D(x_hat - N/2) (the comparison above, c = N/2 on x mod N), and x = x_hat
    - r_in + N D(x_hat) over the integers,

        ReLU(x) = s x = x_hat s - r_in s + N [x_hat < N/2] D(x_hat - N/2),

    where r_in s = r_in [x_hat < N/2] - R(x_hat) + R(x_hat - N/2) with R the payload's second element
    (r_in D), and s D(x_hat) = [x_hat < N/2] D(x_hat - N/2) (both are [x_hat < r_in - N/2]): every
    term is a public value times a share. Key: a width-2 DCF key and shares of r_out and r_in; eval:
    two DCF evaluations."""

    _width = 2

    def __init__(self, bits: int, out_bits: int | None = None, *, group: str = "ring"):
        self._setup(bits, out_bits, group)

    @property
    def _shares(self) -> int:
        return 2

    def __repr__(self) -> str:
        return self._describe("ReluGate", "")

    def _payload(self, r: np.ndarray) -> object:
        _, _, _, red = self._ops()
        return np.stack([np.ones_like(r), red(r)], axis=1)

    def _values(self, r: np.ndarray, outs: np.ndarray) -> np.ndarray:
        _, _, _, red = self._ops()
        return np.stack([outs[:, 0], red(r)], axis=1)

    def _combine(self, party: int, x: np.ndarray, dcf_at: Callable, shares: np.ndarray) -> np.ndarray:
        add, sub, mul, red = self._ops()
        half = np.uint64(1 << (self.bits - 1))
        pub = (x < half).astype(np.uint64)
        at_shift, at_x = dcf_at(x - half), dcf_at(x)  # (n, 2): shares of D and of r_in D
        s = sub(at_shift[:, 0], at_x[:, 0])
        if party == 0:
            s = add(s, pub)
        rs = add(mul(shares[:, 1], pub), sub(at_shift[:, 1], at_x[:, 1]))
        wrap = mul(np.full_like(x, (1 << self.bits) % self.modulus), mul(pub, at_shift[:, 0]))
        y = add(add(sub(mul(red(x), s), rs), wrap), shares[:, 0])
        return y.reshape(-1, 1)
