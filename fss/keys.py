"""Key objects: `KeyBatch` (many keys of one party, grouped struct of arrays) and `Key` (a batch of one)."""
from __future__ import annotations

import hmac
from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence, overload

from ._lazy import numpy as _numpy

from . import codec
from .errors import KeyIndexError, KeyMismatchError, ParameterError
from .params import GROUP, TreeParams, check_party

if TYPE_CHECKING:
    import numpy as np
    from numpy.typing import ArrayLike
else:
    np = _numpy(__name__)  # numpy at first use (`fss._lazy`)


def groups(n: int) -> int:
    return -(-n // GROUP)


def to_groups(a: np.ndarray) -> np.ndarray:
    """(..., n) -> (ceil(n / GROUP), ..., GROUP), zero-padded: each group of GROUP keys contiguous."""
    n = a.shape[-1]
    g = groups(n)
    if g == 1:  # one group (a single key): the same array without numpy's axis moves
        out = np.zeros((1,) + a.shape[:-1] + (GROUP,), a.dtype)
        out[0, ..., :n] = a
        return out
    padded = np.zeros(a.shape[:-1] + (g * GROUP,), a.dtype)
    padded[..., :n] = a
    moved = padded.reshape(a.shape[:-1] + (g, GROUP))
    return np.ascontiguousarray(np.moveaxis(moved, -2, 0))


def from_groups(a: np.ndarray, n: int) -> np.ndarray:
    """Inverse of `to_groups`: (G, ..., GROUP) -> (..., n), always a new array (never a view of `a`)."""
    moved = np.moveaxis(a, 0, -2)
    return moved.reshape(moved.shape[:-2] + (-1,))[..., :n].copy()


def payload_dtype(p: TreeParams) -> type[np.unsignedinteger]:
    """Payload corrections are stored in 32 bits when they fit, halving their memory."""
    return np.uint32 if p.out_bits <= 32 else np.uint64


_ARRAYS = ("seeds", "cw_seed", "cw_t", "cw_v")


def _indices(item: object) -> np.ndarray:
    """Key indices (ints, a sequence or an integer array of them) as a flat int64 array; ParameterError
    for anything else (floats, bools, strings, None, ints beyond int64)."""
    arr = item if isinstance(item, np.ndarray) else None
    if arr is None:
        try:
            arr = np.array(item, dtype=object)
        except (TypeError, ValueError) as exc:
            raise ParameterError(f"key indices must be ints, a slice or an integer array: {exc}") from None
    if arr.dtype == object:
        flat = arr.reshape(-1)
        if not all(isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_)) for v in flat):
            raise ParameterError(f"key indices must be ints, a slice or an integer array, got {item!r:.60}")
        if any(not -(1 << 63) <= int(v) < 1 << 63 for v in flat):
            raise KeyIndexError(f"key index out of range: {item!r:.60}")
        return np.array([int(v) for v in flat], dtype=np.int64)
    if arr.dtype.kind not in "iu":
        raise ParameterError(f"key indices must be ints, a slice or an integer array, got dtype {arr.dtype}")
    if arr.dtype == np.uint64 and arr.size and int(arr.max()) >= 1 << 63:
        raise KeyIndexError(f"key index {int(arr.max())} out of range")
    return arr.astype(np.int64).reshape(-1)


@dataclass(frozen=True, eq=False)
class KeyBatch:
    """n keys of one party for one function family, as numpy arrays. Storage is grouped: keys come
    in groups of `GROUP` = 16 (the last one zero-padded), and each group holds all its levels contiguously, so
    that evaluating a group streams through memory once:

    - seeds   (G, 2, GROUP) uint64: root seeds, lo and hi words of the 16-byte seed
    - cw_seed (G, bits, 2, GROUP) uint64: seed correction words, lo and hi (bit 0 of lo always zero)
    - cw_t    (G, bits, GROUP) uint8: control-bit corrections, bit 0 = left, bit 1 = right
    - cw_v    (G, v_levels, width, GROUP) uint32 (out_bits <= 32) or uint64: payload corrections mod
      2^out_bits; the last level is the leaf's (BCG+21's CW^(n+1)); a DPF has only that one.

    `logical()` gives the same fields as (..., n) arrays. The four arrays are read-only views (set
    at construction, whatever the arrays passed in; nothing is copied): the two parties' batches
    from one gen share their correction arrays, so an in-place edit or wipe of one party's batch
    would change the other's, and it raises numpy's "assignment destination is read-only"
    ValueError instead. To change keys, build a new batch (`from_grouped`, `from_logical`) from
    copies (`logical()` returns copies). Every batch having read-only arrays also gives the numba
    kernels one argument type, hence one compiled specialization, whatever made the batch.
    """

    params: TreeParams
    party: int
    n: int
    seeds: np.ndarray
    cw_seed: np.ndarray
    cw_t: np.ndarray
    cw_v: np.ndarray

    @classmethod
    def from_logical(
        cls, params: TreeParams, party: int, seeds: np.ndarray, cw_seed: np.ndarray, cw_t: np.ndarray, cw_v: np.ndarray
    ) -> "KeyBatch":
        """A batch from (2, n), (bits, 2, n), (bits, n) and (v_levels, width, n) arrays."""
        v = cw_v.astype(payload_dtype(params), copy=False)
        return cls(params, party, seeds.shape[-1], to_groups(seeds), to_groups(cw_seed), to_groups(cw_t), to_groups(v))

    @classmethod
    def from_grouped(
        cls, params: TreeParams, party: int, n: int, seeds: np.ndarray, cw_seed: np.ndarray, cw_t: np.ndarray,
        cw_v: np.ndarray,
    ) -> "KeyBatch":
        """A batch of `n` keys from arrays already in the grouped layout (the dataclass fields: G =
        ceil(n / GROUP) groups, the last one zero-padded). Checks shapes and dtypes and copies
        nothing when the arrays are C-contiguous, so memory-mapped arrays stay mapped; raises
        ParameterError otherwise. Like every batch's, its arrays are read-only views of those given."""
        party = check_party(party)
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 0:
            raise ParameterError(f"n must be a non-negative int, got {n!r}")
        g, p = groups(int(n)), params
        expected = {
            "seeds": (seeds, (g, 2, GROUP), np.uint64),
            "cw_seed": (cw_seed, (g, p.bits, 2, GROUP), np.uint64),
            "cw_t": (cw_t, (g, p.bits, GROUP), np.uint8),
            "cw_v": (cw_v, (g, p.v_levels, p.width, GROUP), payload_dtype(p)),
        }
        for name, (a, shape, dtype) in expected.items():
            if not isinstance(a, np.ndarray) or a.shape != shape or a.dtype != dtype or not a.flags.c_contiguous:
                got = f"{a.dtype} {a.shape}" if isinstance(a, np.ndarray) else type(a).__name__
                raise ParameterError(f"{name} of {n} grouped keys of {p.describe()} must be a C-contiguous "
                                     f"{np.dtype(dtype)} array of shape {shape}, got {got}")
        return cls(p, party, int(n), seeds, cw_seed, cw_t, cw_v)

    @classmethod
    def _of(cls, params: TreeParams, party: int, n: int, seeds: np.ndarray, cw_seed: np.ndarray, cw_t: np.ndarray,
            cw_v: np.ndarray) -> "KeyBatch":
        """Private: a batch of arrays the caller made read-only and laid out itself (the gen kernels'
        outputs), without the dataclass's per-field work (about 2 us a batch, most of one key's gen)."""
        self = object.__new__(cls)
        self.__dict__.update(params=params, party=party, n=n, seeds=seeds, cw_seed=cw_seed, cw_t=cw_t, cw_v=cw_v)
        return self

    def __post_init__(self) -> None:
        for name in _ARRAYS:
            a = getattr(self, name)
            if isinstance(a, np.ndarray) and a.flags.writeable:
                view = a.view()
                view.setflags(write=False)
                object.__setattr__(self, name, view)  # frozen dataclass: set once, here

    def logical(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(seeds (2, n), cw_seed (bits, 2, n), cw_t (bits, n), cw_v (v_levels, width, n))."""
        n = self.n
        return from_groups(self.seeds, n), from_groups(self.cw_seed, n), from_groups(self.cw_t, n), from_groups(self.cw_v, n)

    def __len__(self) -> int:
        return self.n

    @overload
    def __getitem__(self, item: int | np.integer) -> Key: ...
    @overload
    def __getitem__(self, item: slice | np.ndarray | Sequence[int]) -> KeyBatch: ...

    def __getitem__(self, item: int | np.integer | slice | ArrayLike) -> "Key | KeyBatch":
        if isinstance(item, (int, np.integer)) and not isinstance(item, bool):
            i = int(item)
            if not -self.n <= i < self.n:
                raise KeyIndexError(f"key index {i} out of range for a batch of {self.n} keys")
            return Key(self.select(slice(i % self.n, i % self.n + 1)))
        return self.select(item)

    def select(self, item: slice | ArrayLike) -> "KeyBatch":
        """The keys at `item` (a slice or index array) as a new batch; costs O(selected keys)."""
        idx = np.arange(self.n)[item] if isinstance(item, slice) else _indices(item)
        if idx.size and (idx.min() < -self.n or idx.max() >= self.n):
            bad = int(idx.min()) if idx.min() < -self.n else int(idx.max())
            raise KeyIndexError(f"key index {bad} out of range for a batch of {self.n} keys")
        idx = idx % max(self.n, 1)
        g, lane = idx // GROUP, idx % GROUP
        parts = [np.moveaxis(a[g, ..., lane], 0, -1) for a in (self.seeds, self.cw_seed, self.cw_t, self.cw_v)]
        return KeyBatch.from_logical(self.params, self.party, *parts)

    @property
    def nbytes(self) -> int:
        """Memory held by the key arrays."""
        return self.seeds.nbytes + self.cw_seed.nbytes + self.cw_t.nbytes + self.cw_v.nbytes

    def to_bytes(self) -> bytes:
        """The batch wire format: a 16-byte header (with the key count), then each key's body
        (docs/key-format.md), written from the grouped arrays in one pass (`fss.codec.encode_grouped`;
        to a file without the whole bytes object: `fss.write_batch`)."""
        return codec.encode_grouped(self.params, self.party, self.n, (self.seeds, self.cw_seed, self.cw_t, self.cw_v))

    @classmethod
    def concatenate(cls, batches: Sequence["KeyBatch"]) -> "KeyBatch":
        """One batch of all keys of `batches` (same parameters and party), in order."""
        if isinstance(batches, KeyBatch) or not isinstance(batches, (list, tuple)):
            raise ParameterError(f"concatenate needs a list or tuple of KeyBatch, got {type(batches).__name__}")
        if not batches:
            raise ParameterError("concatenate needs at least one batch")
        for b in batches:
            if not isinstance(b, KeyBatch):
                raise ParameterError(f"concatenate needs KeyBatch objects, got {type(b).__name__}")
        first = batches[0]
        for b in batches[1:]:
            if b.params != first.params or b.party != first.party:
                raise KeyMismatchError(
                    f"cannot mix {b.params.describe()} party {b.party} with {first.params.describe()} party {first.party}"
                )
        fields = zip(*(b.logical() for b in batches))
        return cls.from_logical(first.params, first.party, *(np.concatenate(f, axis=-1) for f in fields))

    def __repr__(self) -> str:
        return f"KeyBatch({self.params.describe()}, party={self.party}, n={self.n})"


@dataclass(frozen=True, eq=False)
class Key:
    """One party's key for one function: a `KeyBatch` of length one, so that a single evaluation
    takes the same code path as a batch."""

    batch: KeyBatch

    @property
    def params(self) -> TreeParams:
        return self.batch.params

    @property
    def party(self) -> int:
        return self.batch.party

    def to_bytes(self) -> bytes:
        """The single-key wire format: an 8-byte header, then the key's body."""
        return codec.encode_key(self.params, self.party, self.batch.logical())

    def __eq__(self, other: object) -> bool:
        """Equal iff the two keys serialize to the same bytes, compared in constant time
        (`hmac.compare_digest`: the time does not depend on where the secret bytes first differ; it
        does depend on their lengths, which the public parameters fix). NotImplemented for non-keys."""
        if not isinstance(other, Key):
            return NotImplemented
        return hmac.compare_digest(self.to_bytes(), other.to_bytes())

    def __hash__(self) -> int:
        return hash(self.to_bytes())

    def __repr__(self) -> str:
        return f"Key({self.params.describe()}, party={self.party})"
