"""What the DCF and the DPF share: the public gen/eval API over the one tree walk (`fss.backend`)."""
from __future__ import annotations

import operator
import secrets
from typing import TYPE_CHECKING, Iterable, Sequence, Union, cast

from ._lazy import numpy as _numpy

from . import backend, codec, inputs
from .errors import KeyFormatError, KeyMismatchError, ParameterError
from .keys import Key, KeyBatch
from .params import TreeParams, check_int, check_party

if TYPE_CHECKING:
    import numpy as np
    from numpy.typing import ArrayLike
else:
    np = _numpy(__name__)  # numpy at first use (`fss._lazy`)

Payload = Union[int, Sequence[int]]
Share = Union[int, tuple]
ROOT_BYTES = 32  # two 16-byte root seeds per key pair: all the randomness gen needs


def _share_int(value: object, name: str) -> int:
    """One share as a Python int: ints and numpy integers; bools, floats, strings and None refused."""
    if isinstance(value, (bool, np.bool_)):
        raise ParameterError(f"{name} must be an int, got bool")
    try:
        return operator.index(value)  # type: ignore[arg-type]  # any object: its TypeError is the answer
    except TypeError:
        raise ParameterError(f"{name} must be an int, got {type(value).__name__}") from None


class TreeFunction:
    """Base of `DCF` and `DPF`. Subclasses set `params` in their constructor."""

    params: TreeParams

    # --- sizes and codecs -----------------------------------------------------------------
    @property
    def bits(self) -> int:
        return self.params.bits

    @property
    def out_bits(self) -> int:
        return self.params.out_bits

    @property
    def width(self) -> int:
        return self.params.width

    @property
    def key_size(self) -> int:
        """Bytes of one serialized key (`Key.to_bytes()`)."""
        return self.params.key_size

    def key_from_bytes(self, data: bytes, party: int | None = None) -> Key:
        """Strictly parses one key of this function; raises `KeyFormatError` on anything else."""
        return Key(KeyBatch.from_logical(self.params, *codec.decode_key(self.params, data, check_party(party, True))))

    def batch_from_bytes(self, data: bytes, party: int | None = None) -> KeyBatch:
        """Strictly parses a `KeyBatch` of this function (bytes, a bytearray, a memoryview or a uint8
        array, read in place); raises `KeyFormatError` on anything else. `fss.load_batch` needs no
        function: it reads it from the header."""
        return KeyBatch.from_grouped(self.params, *codec.decode_grouped(self.params, data, check_party(party, True)))

    def batch_from_keys(self, keys: Sequence[bytes], party: int) -> KeyBatch:
        """One `KeyBatch` from many single-key encodings of `party` (as `Key.to_bytes()` makes
        them), decoded in one vectorized pass; raises `KeyFormatError` if any is not such a key."""
        p = self.params
        party = check_party(party)
        if isinstance(keys, (str, bytes, bytearray, memoryview)) or not isinstance(keys, Iterable):
            raise ParameterError(f"keys must be a sequence of single-key encodings, got {type(keys).__name__}")
        keys = list(keys)
        header = p.header(party)
        for k in keys:
            if not isinstance(k, (bytes, bytearray)) or len(k) != p.key_size or bytes(k[: len(header)]) != header:
                raise KeyFormatError(f"not a single key of {p.describe()} for party {party}")
        return KeyBatch.from_grouped(p, *codec.decode_keys(p, b"".join(keys), party))

    # --- gen -------------------------------------------------------------------------------
    def gen(self, alpha: int, beta: Payload = 1) -> tuple[Key, Key]:
        """Both parties' keys for the function with threshold `alpha` and payload `beta` (an int, or
        `width` ints; each in [-2^(out_bits-1), 2^out_bits), taken mod 2^out_bits; for group "p61"
        in (-p, p), taken mod p). Randomness from
        the OS CSPRNG. Raises `ParameterError` for alpha outside the domain or a bad beta."""
        return self._gen_with_randomness(alpha, beta, secrets.token_bytes(ROOT_BYTES))

    def _gen_with_randomness(self, alpha: int, beta: Payload, randomness: bytes) -> tuple[Key, Key]:
        """Deterministic gen: `randomness` is the two 16-byte root seeds (party 0's, then party 1's)."""
        a = inputs.point(self.params, alpha, "alpha")
        if len(randomness) != ROOT_BYTES:
            raise ParameterError(f"need {ROOT_BYTES} bytes of randomness for 1 keys, got {len(randomness)}")
        k0, k1 = backend.gen_one(self.params, a, inputs.payload(self.params, beta), randomness)
        return Key(k0), Key(k1)

    def gen_batch(self, alphas: ArrayLike, betas: ArrayLike = 1) -> tuple[KeyBatch, KeyBatch]:
        """Key pairs for many alphas at once, as two `KeyBatch`es (one per party). `betas`: one int,
        for width 1 an array of n ints, for width > 1 one vector of `width` ints or an (n, width)
        array. Raises `ParameterError` for out-of-range alphas or payloads that do not fit."""
        n = int(np.size(alphas))
        return self._gen_batch_with_randomness(alphas, betas, secrets.token_bytes(ROOT_BYTES * n))

    def _gen_batch_with_randomness(
        self, alphas: object, betas: object, randomness: bytes, internal: bool = False
    ) -> tuple[KeyBatch, KeyBatch]:
        """Deterministic batch gen: `randomness` is 32 bytes per key (root seed of party 0, of party 1)."""
        # internal: `alphas` are already internal points (a uint64 array), as `inputs.points` makes them
        a = cast("np.ndarray", alphas) if internal else inputs.points(self.params, alphas, "alpha")
        if a.ndim != 1:
            raise ParameterError(f"alphas must be one-dimensional, got shape {a.shape}")
        n = a.shape[0]
        if len(randomness) != ROOT_BYTES * n:
            raise ParameterError(f"need {ROOT_BYTES * n} bytes of randomness for {n} keys, got {len(randomness)}")
        b = np.ascontiguousarray(inputs.payloads(self.params, betas, n).T)
        roots = np.frombuffer(randomness, dtype="<u8").astype(np.uint64).reshape(n, 2, 2)
        return backend.gen_batch(self.params, a, b, np.ascontiguousarray(roots.transpose(1, 2, 0)))

    # --- eval ------------------------------------------------------------------------------
    def _check_keys(self, keys: object, kind: type[Key] | type[KeyBatch]) -> KeyBatch:
        if not isinstance(keys, kind):
            raise ParameterError(f"expected a {kind.__name__}, got {type(keys).__name__}")
        batch = keys.batch if isinstance(keys, Key) else keys
        if batch.params != self.params:
            raise KeyMismatchError(f"key of {batch.params.describe()} used with {self.params.describe()}")
        return batch

    def _shape(self, shares: np.ndarray) -> np.ndarray:
        """(width, n) kernel output -> (n,) for width 1, else (n, width)."""
        return shares[0] if self.width == 1 else np.ascontiguousarray(shares.T)

    def eval(self, key: Key, x: int) -> Share:
        """This party's share of f(x): an int in [0, 2^out_bits) (group "p61": [0, p)) for width 1,
        else a tuple. The two parties' shares add up to f(x) mod 2^out_bits (or p; see `reconstruct`)."""
        batch = self._check_keys(key, Key)
        xi = inputs.point(self.params, x)
        row = backend.eval_batch(batch, np.array([xi], dtype=np.uint64))[:, 0]
        return int(row[0]) if self.width == 1 else tuple(int(v) for v in row)

    def eval_batch(self, keys: KeyBatch, xs: object) -> np.ndarray:
        """Key k's share at xs[k], for every key: uint64 array (n,) for width 1, else (n, width)."""
        batch = self._check_keys(keys, KeyBatch)
        xi = inputs.points(self.params, xs)
        if xi.shape != (len(batch),):
            raise ParameterError(f"eval_batch needs one point per key: {len(batch)} keys, points of shape {xi.shape}")
        return self._shape(backend.eval_batch(batch, xi))

    def eval_sum(self, keys: KeyBatch, points: object) -> np.ndarray:
        """Sum over all keys of their shares at each point (the server's hot path): uint64 array
        (m,) for width 1, else (m, width), mod 2^out_bits."""
        batch = self._check_keys(keys, KeyBatch)
        pi = inputs.points(self.params, points, "points")
        if pi.ndim != 1:
            raise ParameterError(f"points must be one-dimensional, got shape {pi.shape}")
        return self._shape(backend.eval_sum(batch, pi).T)

    def eval_grid(self, keys: KeyBatch, size: int) -> np.ndarray:
        """Every key's shares at the points x = 0 .. size - 1 (for signed functions lo .. lo + size - 1,
        lo = -2^(bits-1)), size in 1 .. 2^bits: uint64 array (n, size) for width 1, else (n, size, width),
        in the payload group (mod 2^out_bits, or canonical in [0, p) for group "p61"). Entry [k, j]
        equals `eval_batch` of key k at point lo + j, but each key walks its tree once for all points:
        about 2 * size node children, i.e. 2 + width AES blocks per internal node (2 + 2 width for
        p61 keys of format 1), plus the leaf conversion for width > 1 (> 2 for p61 keys of format 2). Raises `ParameterError` for a bad size and
        `KeyMismatchError` for keys of another function."""
        batch = self._check_keys(keys, KeyBatch)
        p = self.params
        size = check_int("size", size, 1, 1 << p.bits)
        out = backend.eval_grid(batch, *self._grid_range(size))
        return out.reshape(len(batch), size) if p.width == 1 else out

    def _grid_range(self, size: int) -> tuple[int, int, bool]:
        """(start, size, reverse) of the internal points of user points lo .. lo + size - 1: user point
        lo + j is internal point j xor input_xor = j, or 2^bits - 1 - j for gt and ge (input_xor's sign
        bit cancels lo's): the internal range reversed."""
        reverse = self.params.cmp in ("gt", "ge")
        return ((1 << self.params.bits) - size if reverse else 0), size, reverse

    def eval_grid_sums(self, keys: KeyBatch, size: int, weights: np.ndarray, offsets: Sequence[int]) -> tuple[np.ndarray, ...]:
        """Linear sketches of `eval_grid`'s values y (n, size, width) over F_p (group "p61" only), without
        that array: with weights W (q, size, c) canonical and offsets o (q,), returns (dots (n, q):
        sum_i sum_{e < c} W[j, i, e] y[k, i, o_j + e], the column sums (size, c) of y[:, :, :c] over the
        keys, and the last point's values y[:, size - 1] (n, width)), all canonical; the same bits as
        computing them from `eval_grid` (`fss._linear`). ParameterError for a bad shape or offset."""
        batch = self._check_keys(keys, KeyBatch)
        p = self.params
        size = check_int("size", size, 1, 1 << p.bits)
        try:  # integers only, compared as Python ints (an offset near 2^63 must not wrap past the check)
            w = np.asarray(weights)
            offs_list = [operator.index(o) for o in offsets]
        except (TypeError, ValueError, OverflowError) as e:
            raise ParameterError(f"eval_grid_sums: weights must be an integer array and offsets integers ({e})") from None
        if not p.prime or w.dtype.kind not in "iu" or w.ndim != 3 or w.shape[1] != size or len(offs_list) != w.shape[0] \
                or not 1 <= w.shape[2] <= p.width:
            raise ParameterError(f"eval_grid_sums needs group p61, integer weights (q, {size}, c <= {p.width}) and q offsets")
        c = w.shape[2]
        if any(o < 0 or o > p.width - c for o in offs_list) or (w.size and (int(w.min()) < 0 or int(w.max()) >= p.modulus)):
            raise ParameterError("eval_grid_sums: an offset out of range or a weight not in [0, p)")
        w = np.ascontiguousarray(w, dtype=np.uint64)
        return backend.eval_grid_sums(batch, *self._grid_range(size), w, np.array(offs_list, dtype=np.int64))

    # --- reconstruction --------------------------------------------------------------------
    @property
    def group(self) -> str:
        """"ring" (values in Z_{2^out_bits}) or "p61" (values in F_p, p = 2^61 - 1)."""
        return self.params.group

    @property
    def modulus(self) -> int:
        """Order of the payload group: 2^out_bits, or p = 2^61 - 1."""
        return self.params.modulus

    def reconstruct(self, share0: object, share1: object, signed: bool = False) -> object:
        """share0 + share1 mod 2^out_bits (ints, tuples or arrays alike); with `signed`, read as
        two's complement in [-2^(out_bits-1), 2^(out_bits-1)). For group "p61": mod p, and with
        `signed` read in (-p/2, p/2). Shares are ints (any sign, taken mod the modulus), equal-length
        tuples of ints, or integer arrays (or sequences of ints beside an array) of broadcastable
        shapes; anything else (floats, strings, bools, None) raises `ParameterError`."""
        if not isinstance(signed, (bool, np.bool_)):
            raise ParameterError(f"signed must be a bool, got {type(signed).__name__}")
        if isinstance(share0, np.ndarray) or isinstance(share1, np.ndarray):
            a, b = self._share_array(share0, "share0"), self._share_array(share1, "share1")
            try:
                np.broadcast_shapes(a.shape, b.shape)
            except ValueError:
                raise ParameterError(f"share arrays of shapes {a.shape} and {b.shape} do not match") from None
            return self._add_arrays(a, b, bool(signed))
        if isinstance(share0, tuple) or isinstance(share1, tuple):
            if not isinstance(share0, (tuple, list)) or not isinstance(share1, (tuple, list)):
                raise ParameterError("tuple shares must be two tuples of one length, "
                                     f"got {type(share0).__name__} and {type(share1).__name__}")
            if len(share0) != len(share1):
                raise ParameterError(f"tuple shares must be two tuples of one length, got lengths {len(share0)} and {len(share1)}")
            return tuple(self._add_ints(_share_int(a, "share0"), _share_int(b, "share1"), bool(signed))
                         for a, b in zip(share0, share1))
        return self._add_ints(_share_int(share0, "share0"), _share_int(share1, "share1"), bool(signed))

    def _add_ints(self, a: int, b: int, signed: bool) -> int:
        q = self.params.modulus
        v = (a + b) % q
        if self.params.prime:
            return v - q if signed and v > q // 2 else v
        return v - q if signed and v >= q >> 1 else v

    def _share_array(self, value: object, name: str) -> np.ndarray:
        """An integer array as uint64 (as before: native integer dtypes wrap mod 2^64); anything else
        element by element, each an int taken mod the modulus (object arrays, lists, one int)."""
        if isinstance(value, np.ndarray) and value.dtype.kind in "iu":
            return value.astype(np.uint64, copy=False)
        if isinstance(value, np.ndarray) and value.dtype != object:
            raise ParameterError(f"{name} must be an integer array, got dtype {value.dtype}")
        try:
            arr = value if isinstance(value, np.ndarray) else np.array(value, dtype=object)
        except (TypeError, ValueError) as exc:
            raise ParameterError(f"{name} must be ints or an integer array: {exc}") from None
        q = self.params.modulus
        flat = [_share_int(v, name) % q for v in arr.reshape(-1)]
        return np.array(flat, dtype=np.uint64).reshape(arr.shape)

    def _add_arrays(self, a: np.ndarray, b: np.ndarray, signed: bool) -> np.ndarray:
        if self.params.prime:
            from . import field

            total = field.add(field.reduce64(a), field.reduce64(b))
            return field.signed(total) if signed else total
        m, half = self.params.mask, 1 << (self.out_bits - 1)
        total = (a + b) & np.uint64(m)
        if not signed:
            return total
        if self.out_bits == 64:
            return total.view(np.int64)
        wide = total.astype(np.int64)
        return np.where(wide >= half, wide - (m + 1), wide)

    def __repr__(self) -> str:
        return self.params.describe()
