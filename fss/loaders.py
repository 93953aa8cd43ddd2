"""Keys from their bytes alone, and key batches to and from files.

A key's 8-byte header names its function completely (kind, bits, out_bits, comparison, signed, group,
width and key format version: docs/key-format.md), so no function need be built first:

    >>> import fss
    >>> k0, k1 = fss.DCF(16, group="p61", version=1).gen(alpha=300)
    >>> fn, key = fss.load_key(k0.to_bytes())       # the function comes from the header
    >>> fn.params == k0.params and key == k0
    True

`load_key`, `load_batch`, `load_keys` and `read_batch` return (function, key or batch) pairs,
`Loaded`, whose function is the `DCF` or `DPF` the header names (F_p keys of format 1 or 2 alike).
Anything that is not such a key raises `KeyFormatError` (an `FssError`): fewer bytes than the header,
an unknown version, kind or flag, a header that names no function, a wrong length, reserved bits or
padding.

Batches stream: `write_batch(batch, file)` writes `batch.to_bytes()`'s bytes a chunk at a time (never
the whole bytes object), and `read_batch(file)` reads them back: from a path by mapping the file
(`np.memmap`) and parsing it where it lies, from a binary file object chunk by chunk. Either way the
bytes are read once and written once, into the batch's grouped arrays (`fss._serial`).
"""
from __future__ import annotations

import os
from typing import TYPE_CHECKING, NamedTuple, Union

from ._lazy import numpy as _numpy

from . import codec
from .dcf import DCF
from .dpf import DPF
from .errors import KeyFormatError, ParameterError
from .function import TreeFunction
from .keys import GROUP, Key, KeyBatch
from .params import BATCH_HEADER_LEN, KIND_DCF, TreeParams, check_party

if TYPE_CHECKING:
    import numpy as np
else:
    np = _numpy(__name__)  # numpy at first use (`fss._lazy`)

PathLike = Union[str, "os.PathLike[str]"]
CHUNK_BYTES = 1 << 24  # write_batch and read_batch (file objects) move whole groups of about this many bytes


class Loaded(NamedTuple):
    """What a loader returns: the function the header names, and the key (or `KeyBatch`)."""

    function: TreeFunction
    key: Union[Key, KeyBatch]


def function_of(params: TreeParams) -> TreeFunction:
    """The `DCF` or `DPF` of these parameters (`key.params`, `batch.params`)."""
    if not isinstance(params, TreeParams):
        raise ParameterError(f"expected TreeParams, got {type(params).__name__}")
    group, version = params.group, params.version
    if params.kind == KIND_DCF:
        return DCF(params.bits, params.out_bits, params.width, cmp=params.cmp, signed=params.signed, group=group,
                   version=version)
    return DPF(params.bits, params.out_bits, params.width, signed=params.signed, group=group, version=version)


def load_key(data: bytes) -> Loaded:
    """(function, key) of one key's bytes (`Key.to_bytes()`); KeyFormatError for anything else,
    a batch included (`load_batch`)."""
    p, party, batch = codec.parse_header(data)
    if batch:
        raise KeyFormatError("these bytes are a key batch, not a single key: use fss.load_batch")
    fn = function_of(p)
    return Loaded(fn, fn.key_from_bytes(data, party))


def load_batch(data: object) -> Loaded:
    """(function, batch) of a batch's bytes (`KeyBatch.to_bytes()`: bytes, a bytearray, a memoryview or
    a uint8 array, parsed where they lie); KeyFormatError for anything else, a single key included."""
    p, party, batch = codec.parse_header(data)
    if not batch:
        raise KeyFormatError("these bytes are a single key, not a key batch: use fss.load_key (or fss.load_keys)")
    return Loaded(function_of(p), KeyBatch.from_grouped(p, *codec.decode_grouped(p, data, party)))


def load_keys(data: object, party: int | None = None) -> Loaded:
    """(function, batch) of single keys end to end (each `Key.to_bytes()`, as a store keeps them),
    all of the first key's function and party (and of `party`, if given), parsed where they lie in
    one pass; KeyFormatError for anything else."""
    party = check_party(party, optional=True)
    p, _, batch = codec.parse_header(data)
    if batch:
        raise KeyFormatError("these bytes start with a key batch, not single keys: use fss.load_batch")
    return Loaded(function_of(p), KeyBatch.from_grouped(p, *codec.decode_keys(p, data, party)))


def _chunk_groups(p: TreeParams) -> int:
    return max(1, CHUNK_BYTES // (GROUP * p.body_len))


def write_batch(batch: KeyBatch, file: PathLike | object) -> int:
    """Writes `batch.to_bytes()`'s bytes to `file` (a path, created or truncated, or a binary file
    object, written from its position) a chunk of whole groups at a time, without making the whole
    bytes object; returns the number of bytes written."""
    if not isinstance(batch, KeyBatch):
        raise ParameterError(f"expected a KeyBatch, got {type(batch).__name__}")
    if isinstance(file, (str, os.PathLike)):
        with open(file, "wb") as f:
            return write_batch(batch, f)
    if not hasattr(file, "write"):
        raise ParameterError(f"expected a path or a binary file object, got {type(file).__name__}")
    p, n = batch.params, batch.n
    arrays = (batch.seeds, batch.cw_seed, batch.cw_t, batch.cw_v)
    file.write(p.header(batch.party, batch=True) + n.to_bytes(8, "little"))
    step = _chunk_groups(p)
    buf = np.empty(min(n, step * GROUP) * p.body_len, np.uint8)
    for g0 in range(0, batch.seeds.shape[0], step):
        g1 = min(g0 + step, batch.seeds.shape[0])
        m = min(n, g1 * GROUP) - g0 * GROUP
        codec.encode_into(p, n, arrays, g0, g1, buf, 0)
        file.write(buf.data[: m * p.body_len])
    return BATCH_HEADER_LEN + n * p.body_len


def read_batch(file: PathLike | object, function: TreeFunction | None = None, party: int | None = None) -> Loaded:
    """(function, batch) of a batch `write_batch` (or `to_bytes`) wrote: from a path, the file is
    mapped (`np.memmap`) and parsed where it lies and must hold exactly the batch; from a binary file
    object, the batch is read from its position, a chunk at a time, and the position left after it
    (so batches can follow each other in one stream). With `function` or `party`, the batch must be of
    them. KeyFormatError for a truncated, corrupt or foreign file; ParameterError for a bad argument."""
    if function is not None and not isinstance(function, TreeFunction):
        raise ParameterError(f"function must be a DCF or DPF, got {type(function).__name__}")
    party = check_party(party, optional=True)
    if isinstance(file, (str, os.PathLike)):
        if os.path.getsize(file) == 0:
            raise KeyFormatError(f"{os.fspath(file)} is empty, not a key batch")
        data = np.memmap(file, dtype=np.uint8, mode="r")
        try:
            fn, batch = load_batch(np.asarray(data))
        finally:
            del data  # the batch holds copies: the mapping closes with the last view of it
    elif hasattr(file, "read"):
        fn, batch = _read_stream(file)
    else:
        raise ParameterError(f"expected a path or a binary file object, got {type(file).__name__}")
    if function is not None and function.params != batch.params:
        raise KeyFormatError(f"a batch of {batch.params.describe()}, expected {function.params.describe()}")
    if party is not None and batch.party != party:
        raise KeyFormatError(f"a batch of party {batch.party}, expected party {party}")
    return Loaded(fn, batch)


def _read_exactly(f, buf: memoryview) -> int:
    """Fills `buf` from the stream as far as it goes; returns the bytes read."""
    got = 0
    readinto = getattr(f, "readinto", None)
    while got < len(buf):
        if readinto is not None:
            k = readinto(buf[got:])
        else:
            chunk = f.read(len(buf) - got)
            k = len(chunk)
            buf[got : got + k] = chunk
        if not k:
            break
        got += k
    return got


def _read_stream(f) -> Loaded:
    head = bytearray(BATCH_HEADER_LEN)
    got = _read_exactly(f, memoryview(head))
    p, party, batch = codec.parse_header(bytes(head[:got]))
    if not batch:
        raise KeyFormatError("the file holds a single key, not a key batch")
    if got < BATCH_HEADER_LEN:
        raise KeyFormatError(f"a key batch is at least {BATCH_HEADER_LEN} bytes, the file ends after {got}")
    n = codec.batch_count(p, bytes(head), None)
    arrays = codec.grouped_arrays(p, n)
    step = _chunk_groups(p)
    groups = arrays[0].shape[0]
    buf = np.empty(min(n, step * GROUP) * p.body_len, np.uint8)
    for g0 in range(0, groups, step):
        g1 = min(g0 + step, groups)
        size = (min(n, g1 * GROUP) - g0 * GROUP) * p.body_len
        got = _read_exactly(f, buf.data[:size])
        if got < size:
            done = BATCH_HEADER_LEN + g0 * GROUP * p.body_len + got
            raise KeyFormatError(f"a batch of {n} keys of {p.describe()} is {BATCH_HEADER_LEN + n * p.body_len} bytes, "
                                 f"the file ends after {done}")
        codec.decode_into(p, buf[:size], 0, n, g0, g1, arrays)
    fn = function_of(p)
    return Loaded(fn, KeyBatch.from_grouped(p, party, n, *arrays))


__all__ = ["Loaded", "function_of", "load_batch", "load_key", "load_keys", "read_batch", "write_batch"]
