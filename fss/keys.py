"""Key objects: `KeyBatch` (many keys of one party, struct of arrays) and `Key` (a batch of one)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from .errors import KeyMismatchError, ParameterError
from .params import TreeParams


@dataclass(frozen=True, eq=False)
class KeyBatch:
    """n keys of one party for one function family, as numpy arrays: struct of arrays, level-major,
    key index last, so that one level of a run of keys is one contiguous vector per field:

    - seeds   (2, n) uint64: root seeds, lo and hi words of the 16-byte seed
    - cw_seed (bits, 2, n) uint64: seed correction words, lo and hi (bit 0 of lo always zero)
    - cw_t    (bits, n) uint8: control-bit corrections, bit 0 = left, bit 1 = right
    - cw_v    (v_levels, width, n) uint64: payload corrections, reduced mod 2^out_bits; the last
      level is the leaf's (BCG+21's CW^(n+1)); a DPF has only that one.

    Treat the arrays as read-only: the two parties' batches from one gen share their corrections.
    """

    params: TreeParams
    party: int
    seeds: np.ndarray
    cw_seed: np.ndarray
    cw_t: np.ndarray
    cw_v: np.ndarray

    def __len__(self) -> int:
        return self.seeds.shape[1]

    def __getitem__(self, item: int | slice | np.ndarray) -> "Key | KeyBatch":
        if isinstance(item, (int, np.integer)):
            i = int(item)
            if not -len(self) <= i < len(self):
                raise IndexError(f"key index {i} out of range for a batch of {len(self)}")
            return Key(self.select(slice(i % len(self), i % len(self) + 1)))
        return self.select(item)

    def select(self, item: slice | np.ndarray) -> "KeyBatch":
        """The keys at `item` (a slice or index array) as a new batch."""
        return KeyBatch(
            self.params,
            self.party,
            np.ascontiguousarray(self.seeds[:, item]),
            np.ascontiguousarray(self.cw_seed[:, :, item]),
            np.ascontiguousarray(self.cw_t[:, item]),
            np.ascontiguousarray(self.cw_v[:, :, item]),
        )

    @property
    def nbytes(self) -> int:
        """Memory held by the key arrays."""
        return self.seeds.nbytes + self.cw_seed.nbytes + self.cw_t.nbytes + self.cw_v.nbytes

    def to_bytes(self) -> bytes:
        """The batch wire format: a 16-byte header (with the key count), then each key's body."""
        from .codec import encode_batch

        return encode_batch(self)

    @classmethod
    def concatenate(cls, batches: Sequence["KeyBatch"]) -> "KeyBatch":
        """One batch of all keys of `batches` (same parameters and party), in order."""
        if not batches:
            raise ParameterError("concatenate needs at least one batch")
        first = batches[0]
        for b in batches[1:]:
            if b.params != first.params or b.party != first.party:
                raise KeyMismatchError(
                    f"cannot mix {b.params.describe()} party {b.party} with {first.params.describe()} party {first.party}"
                )
        return cls(
            first.params,
            first.party,
            np.concatenate([b.seeds for b in batches], axis=1),
            np.concatenate([b.cw_seed for b in batches], axis=2),
            np.concatenate([b.cw_t for b in batches], axis=1),
            np.concatenate([b.cw_v for b in batches], axis=2),
        )

    def __repr__(self) -> str:
        return f"KeyBatch({self.params.describe()}, party={self.party}, n={len(self)})"


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
        from .codec import encode_key

        return encode_key(self)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Key) and self.to_bytes() == other.to_bytes()

    def __hash__(self) -> int:
        return hash(self.to_bytes())

    def __repr__(self) -> str:
        return f"Key({self.params.describe()}, party={self.party})"
