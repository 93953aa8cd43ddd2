"""Keys as rows and as grouped arrays: what a store, a transport or a file format needs to hold many
keys without rebuilding the key format itself.

A *row* is one key's single-key encoding (`Key.to_bytes()`: the 8-byte header, then the body) as one
row of a uint8 array (n, key_size). A store that keeps one key per record, or a report that carries a
key beside other bytes, reads and writes keys this way; a row may be a slice of a wider row (its
columns contiguous, its rows any stride apart), so keys are read where they lie:

    >>> import numpy as np
    >>> from fss import DCF, layout
    >>> dcf = DCF(bits=8)
    >>> k0, _ = dcf.gen_batch(np.arange(5))
    >>> rows = layout.key_rows(k0)                    # (5, dcf.key_size) uint8: row i is k0[i].to_bytes()
    >>> layout.batch_from_rows(dcf, rows, party=0).n  # one vectorized decode, strict
    5
    >>> rows[2, 8 + 16] |= 1                          # the reserved bit of its first seed correction word
    >>> found = layout.keys_from_rows(dcf, rows, party=0)
    >>> found.keys.n, sorted(found.bad)               # the good rows' keys, and why each other is refused
    (4, [2])

The *grouped* layout is a `KeyBatch`'s own (its four arrays, `ARRAYS`, in groups of `GROUP` keys,
the last group zero-padded): `grouped_shapes` gives each array's shape and dtype for n keys, so that
files of them can be laid out (or mapped) before the keys arrive, and `KeyBatch.from_grouped` wraps
such arrays without copying them.

`KEY_FORMATS` lists the key format versions each payload group reads (the header's first byte,
docs/key-format.md); the last is the one a new function writes unless told otherwise.

Every function validates its arguments: a wrong type or shape raises `ParameterError`, bytes that are
not keys of the function named raise `KeyFormatError` (both `FssError`s).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple, Union

from ._lazy import numpy as _numpy

from . import codec
from .errors import KeyFormatError, ParameterError
from .function import TreeFunction
from .keys import KeyBatch, groups, payload_dtype
from .params import GROUP, HEADER_LEN, VERSIONS, TreeParams, check_party

if TYPE_CHECKING:
    import numpy as np
else:
    np = _numpy(__name__)  # numpy at first use (`fss._lazy`)

ARRAYS = ("seeds", "cw_seed", "cw_t", "cw_v")
"""The names of a `KeyBatch`'s grouped arrays, in the order `KeyBatch.from_grouped` takes them."""
KEY_FORMATS: dict[str, tuple[int, ...]] = {group: tuple(v) for group, v in VERSIONS.items()}
"""Payload group ("ring", "p61") -> the key format versions its functions have, oldest first; the last
is the default of `DCF(..., group=...)` and `DPF(...)`."""

Function = Union["TreeFunction", TreeParams]
"""A `DCF` or `DPF`, or its `params` (what `key.params` and `batch.params` give)."""

__all__ = ["ARRAYS", "GROUP", "KEY_FORMATS", "Function", "RowKeys", "batch_from_rows", "groups", "grouped_shapes",
           "key_rows", "keys_from_rows"]


class RowKeys(NamedTuple):
    """What `keys_from_rows` found: the keys of the rows that are keys (in row order), and the index
    of every other row with the reason it is not one."""

    keys: KeyBatch
    bad: dict[int, str]


def _params(function: object) -> TreeParams:
    if isinstance(function, TreeParams):
        return function
    params = getattr(function, "params", None)
    if not isinstance(params, TreeParams) or not isinstance(function, TreeFunction):  # a key or a batch has params too
        raise ParameterError(f"expected a DCF, a DPF or their params, got {type(function).__name__}")
    return params


def grouped_shapes(function: Function, n: int) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
    """Each grouped array of n keys of `function` (`ARRAYS`, in order) -> (shape, dtype), as
    `KeyBatch.from_grouped` wants them: ceil(n / GROUP) groups, payload corrections in uint32 where
    out_bits <= 32. ParameterError for a negative or non-int n."""
    p = _params(function)
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 0:
        raise ParameterError(f"n must be a non-negative int, got {n!r}")
    g = groups(int(n))
    return {"seeds": ((g, 2, GROUP), np.dtype(np.uint64)), "cw_seed": ((g, p.bits, 2, GROUP), np.dtype(np.uint64)),
            "cw_t": ((g, p.bits, GROUP), np.dtype(np.uint8)),
            "cw_v": ((g, p.v_levels, p.width, GROUP), np.dtype(payload_dtype(p)))}


def key_rows(batch: KeyBatch, out: np.ndarray | None = None) -> np.ndarray:
    """Each key of `batch` in the single-key format, row k = `batch[k].to_bytes()`, as one (n, key_size)
    uint8 array, from one pass over the batch. With `out` (a writable uint8 array of that shape, such
    as the first columns of wider rows), the rows are written there and `out` is returned."""
    if not isinstance(batch, KeyBatch):
        raise ParameterError(f"expected a KeyBatch, got {type(batch).__name__}")
    p, n = batch.params, batch.n
    if out is None:
        out = np.empty((n, p.key_size), np.uint8)
    elif not isinstance(out, np.ndarray) or out.dtype != np.uint8 or out.shape != (n, p.key_size) or not out.flags.writeable:
        got = f"{out.dtype} {out.shape}" if isinstance(out, np.ndarray) else type(out).__name__
        raise ParameterError(f"out must be a writable uint8 array of shape {(n, p.key_size)}, got {got}")
    if n:
        from . import _serial

        arrays = tuple(np.ascontiguousarray(getattr(batch, name)) for name in ARRAYS)
        bodies = np.empty(n * p.body_len, np.uint8)
        _serial.encode_all(arrays, n, p.out_bits, bodies, 0, p.body_len, p.t_bytes, p.v_bytes)
        out[:, :HEADER_LEN] = np.frombuffer(p.header(batch.party), np.uint8)
        out[:, HEADER_LEN:] = bodies.reshape(n, p.body_len)
    return out


def _rows(p: TreeParams, rows: object) -> np.ndarray:
    """`rows` as a 2-D uint8 array of key_size columns: a uint8 array as it is, bytes-like as n keys end
    to end (read in place)."""
    if isinstance(rows, (bytes, bytearray, memoryview)):
        buf = codec.as_buffer(rows)
        if buf.size % p.key_size:
            raise KeyFormatError(f"{buf.size} bytes are not a whole number of {p.key_size}-byte keys of {p.describe()}")
        return buf.reshape(-1, p.key_size)
    if not isinstance(rows, np.ndarray) or rows.dtype != np.uint8 or rows.ndim != 2:
        got = f"a {rows.dtype} array of shape {rows.shape}" if isinstance(rows, np.ndarray) else type(rows).__name__
        raise ParameterError(f"rows must be a 2-D uint8 array or bytes, got {got}")
    if rows.shape[1] != p.key_size:
        raise KeyFormatError(f"rows of {rows.shape[1]} bytes are not keys of {p.describe()} ({p.key_size} bytes each)")
    return rows


def _flat(rows: np.ndarray) -> tuple[np.ndarray, int]:
    """(a read-only 1-d view of the bytes the rows span, the distance from one row's start to the next),
    without a copy where the rows' columns are contiguous and the rows ascend (else of a copy)."""
    n, width = rows.shape
    if n and (rows.strides[1] != 1 or rows.strides[0] < width):
        rows = np.ascontiguousarray(rows)
    stride = rows.strides[0] if n > 1 else width
    span = (n - 1) * stride + width if n else 0
    return np.lib.stride_tricks.as_strided(rows, shape=(span,), strides=(1,), writeable=False), stride


def _header_faults(p: TreeParams, rows: np.ndarray, party: int) -> dict[int, str]:
    """Row index -> why its header is not `party`'s single-key header of `p`, for every such row."""
    header = np.frombuffer(p.header(party), np.uint8)
    faults = {}
    for k in np.flatnonzero((rows[:, :HEADER_LEN] != header).any(axis=1)).tolist():
        try:  # a header that differs from this one fails one of these checks (they cover all 8 bytes)
            codec._check_header(p, rows[k, :HEADER_LEN].tobytes(), batch=False, party=party)
        except KeyFormatError as exc:
            faults[k] = str(exc)
        else:
            faults[k] = f"not a single key of {p.describe()} for party {party}"
    return faults


def _decode(p: TreeParams, rows: np.ndarray, party: int) -> KeyBatch:
    """The rows' keys (headers already checked) as one batch; KeyFormatError naming the first bad row."""
    n = rows.shape[0]
    arrays = codec.grouped_arrays(p, n)
    if n:
        flat, stride = _flat(rows)
        codec.decode_all(p, flat, HEADER_LEN, n, arrays, gap=stride - p.body_len)
    return KeyBatch.from_grouped(p, party, n, *arrays)


def batch_from_rows(function: Function, rows: object, party: int) -> KeyBatch:
    """The keys of `rows` (a uint8 array (n, key_size), each row one key of `function` for `party` in
    the single-key format, or bytes of such keys end to end) as one `KeyBatch`, decoded in one
    vectorized pass over the bytes where they lie, as strictly as `function.key_from_bytes` decodes one:
    KeyFormatError for the first row that is not such a key (its header, reserved bits, padding, a
    payload correction not below p)."""
    p, party = _params(function), check_party(party)
    rows = _rows(p, rows)
    faults = _header_faults(p, rows, party)
    if faults:
        k = min(faults)
        raise KeyFormatError(f"row {k} is not a key of {p.describe()} for party {party}: {faults[k]}")
    return _decode(p, rows, party)


def keys_from_rows(function: Function, rows: object, party: int) -> RowKeys:
    """As `batch_from_rows`, but a row that is not a key is left out instead of refusing them all:
    (the other rows' keys as one batch, in row order; row index -> the reason for each row left out).
    A row is left out exactly when `function.key_from_bytes(row, party)` would raise. One vectorized
    decode when every row is a key; otherwise each row is checked alone (one small numba call each)
    and the good ones decoded together. KeyFormatError only when `rows` cannot be rows of this
    function's keys at all (bytes that are not a whole number of keys, rows of another width)."""
    p, party = _params(function), check_party(party)
    rows = _rows(p, rows)
    bad = _header_faults(p, rows, party)
    if not bad:
        try:
            return RowKeys(_decode(p, rows, party), {})
        except KeyFormatError:
            pass  # find the bad ones
    flat, stride = _flat(rows)
    scratch = codec.grouped_arrays(p, 1)
    for k in range(rows.shape[0]):
        if k not in bad:
            try:
                codec.decode_into(p, flat, k * stride + HEADER_LEN, 1, 0, 1, scratch)
            except KeyFormatError as exc:
                bad[k] = str(exc).rsplit(" (key ", 1)[0]  # the reason, without the index within the one-key run
    good = np.array([k for k in range(rows.shape[0]) if k not in bad], np.int64)
    return RowKeys(_decode(p, rows[good], party), dict(sorted(bad.items())))
