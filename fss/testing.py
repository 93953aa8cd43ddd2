"""Deterministic key generation, FOR TESTS AND INTEROP VECTORS ONLY.

    !!! NEVER USE THIS MODULE FOR KEYS THAT PROTECT ANYTHING. !!!

A key pair is a function of its two 16-byte root seeds and nothing else: whoever knows the seeds (the
`randomness` or the `seed` passed here, or can guess them) computes both parties' keys, and from them
alpha and beta, the very secrets the keys exist to hide. `DCF.gen`, `DCF.gen_batch` (and the DPF's and
the gates') draw the seeds from the OS CSPRNG (`secrets.token_bytes`); that is the only way to make
keys anyone relies on, and nothing in `fss` calls this module.

What it is for: reproducible tests, known-answer vectors (tests/vectors/), and checking another
implementation byte for byte against this one (docs/key-format.md, "Known-answer vectors"):

    >>> from fss import DCF, testing
    >>> dcf = DCF(bits=8, out_bits=8)
    >>> k0, k1 = testing.gen(dcf, alpha=200, beta=1, randomness=bytes(range(32)))
    >>> k0.to_bytes() == testing.gen(dcf, 200, 1, randomness=bytes(range(32)))[0].to_bytes()
    True

`gen(fn, alpha, beta, randomness=32 bytes)` is `fn.gen` with the root seeds given (party 0's, then
party 1's: the `randomness` field of the vectors). `gen_batch(fn, alphas, betas, seed=...)` is
`fn.gen_batch` with 32 bytes a key taken from SHAKE-256 of `SEED_DOMAIN` and the seed (bytes, or an int
in [0, 2^256) as 32 little-endian bytes), so a test can name a batch by one small number; or with
`randomness=` 32 bytes a key, key i's at [32 i, 32 i + 32).
"""
from __future__ import annotations

import hashlib
import operator
from typing import TYPE_CHECKING

from .errors import ParameterError
from .params import check_int
from .function import ROOT_BYTES, Payload, TreeFunction
from .keys import Key, KeyBatch

if TYPE_CHECKING:
    from numpy.typing import ArrayLike

SEED_DOMAIN = b"fss-dpcdf/testing/gen-batch-seed/v1\x00"


def _check(function: object) -> TreeFunction:
    if not isinstance(function, TreeFunction):
        raise ParameterError(f"expected a DCF or DPF, got {type(function).__name__}")
    return function


def _randomness(value: object, size: int) -> bytes:
    if not isinstance(value, (bytes, bytearray, memoryview)):
        raise ParameterError(f"randomness must be bytes, got {type(value).__name__}")
    value = bytes(value)
    if len(value) != size:
        raise ParameterError(f"need {size} bytes of randomness, got {len(value)}")
    return value


def expand_seed(seed: bytes | int, size: int) -> bytes:
    """`size` bytes of SHAKE-256(SEED_DOMAIN || seed), seed bytes or an int in [0, 2^256) (32 bytes,
    little-endian): `gen_batch`'s root seeds, 32 bytes a key. NOT a CSPRNG for secrets: a known seed."""
    if isinstance(seed, (bytes, bytearray, memoryview)):
        raw = bytes(seed)
    else:
        try:
            value = operator.index(seed) if not isinstance(seed, bool) else None
        except TypeError:
            value = None
        if value is None or not 0 <= value < 1 << 256:
            raise ParameterError(f"seed must be bytes or an int in [0, 2^256), got {seed!r}")
        raw = value.to_bytes(32, "little")
    size = check_int("size", size, 0, 1 << 40)
    return hashlib.shake_256(SEED_DOMAIN + raw).digest(size)


def gen(function: TreeFunction, alpha: int, beta: Payload = 1, *, randomness: bytes) -> tuple[Key, Key]:
    """FOR TESTS AND VECTORS ONLY (see the module): `function.gen(alpha, beta)` with the two 16-byte root
    seeds given, party 0's then party 1's (32 bytes). The same arguments give the same key bytes on
    every backend (tests/vectors/ holds them to it)."""
    fn = _check(function)
    return fn._gen_with_randomness(alpha, beta, _randomness(randomness, ROOT_BYTES))


def gen_batch(function: TreeFunction, alphas: ArrayLike, betas: ArrayLike = 1, *, seed: bytes | int | None = None,
              randomness: bytes | None = None) -> tuple[KeyBatch, KeyBatch]:
    """FOR TESTS AND VECTORS ONLY (see the module): `function.gen_batch(alphas, betas)` with its root
    seeds given: exactly one of `seed` (expanded by `expand_seed`) or `randomness` (32 bytes a key).
    Key i of the batch equals `gen(function, alphas[i], betas[i], randomness=those 32 bytes)`."""
    fn = _check(function)
    import numpy as np

    n = int(np.size(alphas))
    if (seed is None) == (randomness is None):
        raise ParameterError("gen_batch needs exactly one of seed= and randomness=")
    rnd = expand_seed(seed, ROOT_BYTES * n) if seed is not None else _randomness(randomness, ROOT_BYTES * n)
    return fn._gen_batch_with_randomness(alphas, betas, rnd)


__all__ = ["SEED_DOMAIN", "expand_seed", "gen", "gen_batch"]
