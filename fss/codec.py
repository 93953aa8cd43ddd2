"""The strict, versioned wire format of keys and key batches.

Single key (all integers little-endian, bit fields least significant bit first):

    header   8 bytes   version (1; 2 for F_p keys of format 2) | kind (1 DCF, 2 DPF) | party | bits | out_bits |
                       flags (cmp code in bits 0-2: lt le gt ge eq = 0..4; bit 3 signed;
                       bit 4 payloads in F_p, p = 2^61 - 1, with out_bits = 61) | width u16
    seed     16        party's root seed
    cw_seed  16*bits   seed correction per level; bit 0 of every one is reserved and zero
    cw_t     ceil(2*bits/8)       bit 2i = left, bit 2i+1 = right control-bit correction of level i
    cw_v     ceil(L*width*out_bits/8)   L = bits+1 (DCF) or 1 (DPF) payload corrections, level-major,
                       each element out_bits wide
    padding bits at the end of cw_t and cw_v are zero; F_p payload corrections are below p.
Bit 4 of the flags came with the prime field; keys without it are byte-identical to the first
release, whose decoders refuse keys with it (any unexpected flag is a parameter mismatch). Version 2
came with F_p key format 2 (elements rejection-sampled from 61-bit words, `fss.prg`): the layout is the
same, and a function parses only keys of its own version (`TreeParams.version`).

Batch: the same header with kind | 0x80, a u64 key count, then the bodies (everything after the
header) of the keys in order. Decoding refuses anything else with `KeyFormatError`: wrong length,
version, kind, party, parameters, reserved bits or padding. docs/key-format.md is the specification.

Two paths make the same bytes. Single keys, and the logical arrays (`encode_batch`, `decode_batch`),
go through numpy here (no numba). Batches (`encode_grouped`, `decode_grouped`, which `KeyBatch.to_bytes`,
`batch_from_bytes` and `fss.loaders` use) go straight between the grouped arrays and the bytes in one
numba pass (`fss._serial`), at memory speed; the tests hold the two paths to the same bytes.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from ._lazy import numpy as _numpy

from .errors import KeyFormatError, ParameterError
from .params import (BATCH_FLAG, BATCH_HEADER_LEN, CMP_NAMES, GROUP, HEADER_LEN, KIND_DCF, KIND_DPF, LAMBDA_BYTES, PRIME_FLAG,
                     SIGNED_FLAG, VERSIONS, TreeParams)

if TYPE_CHECKING:
    import numpy as np
else:
    np = _numpy(__name__)  # numpy at first use (`fss._lazy`)

_CHUNK = 8192  # keys per chunk in the bit (un)packing, to bound temporary memory


def _bodies(p: TreeParams, fields: tuple, lo: int, hi: int) -> np.ndarray:
    """Bodies of keys lo..hi as an (hi - lo, body_len) uint8 array; `fields` = KeyBatch.logical()."""
    m = hi - lo
    seeds_all, cw_seed, cw_t, cw_v = fields
    seeds = np.ascontiguousarray(seeds_all[:, lo:hi].T).astype("<u8", copy=False)
    seeds = seeds.view(np.uint8).reshape(m, LAMBDA_BYTES)
    cws = np.ascontiguousarray(cw_seed[:, :, lo:hi].transpose(2, 0, 1)).astype("<u8", copy=False)
    cws = cws.view(np.uint8).reshape(m, p.bits * LAMBDA_BYTES)
    ct = cw_t[:, lo:hi].T
    tbits = np.stack([ct & 1, (ct >> 1) & 1], axis=-1).reshape(m, 2 * p.bits)
    tbytes = np.packbits(tbits, axis=1, bitorder="little")
    vals = np.ascontiguousarray(cw_v[:, :, lo:hi].transpose(2, 0, 1)).reshape(m, -1).astype("<u8")
    vbytes = vals.view(np.uint8).reshape(m, -1) if p.out_bits == 64 else _pack(vals, p.out_bits, p.v_bytes)
    return np.concatenate([seeds, cws, tbytes, vbytes], axis=1)


_LOOP_COUNT = 1024  # corrections per key up to which `_pack` loops over them (else one scatter over all)


def _pack(vals: np.ndarray, bits: int, nbytes: int) -> np.ndarray:
    """(m, count) values -> (m, nbytes) bytes: the low `bits` of each, one after the other, least
    significant bit first (the payload corrections' layout): value k's bits k b .. k b + b - 1 go to
    word k b / 64 and, where they cross it, the next; the values' bits are disjoint, so adding is
    or-ing. A loop over a key's corrections with the keys as the vector (0.55 us a key of 68, against
    4 us with a byte per bit), or for very wide keys one scatter-add over all of them."""
    m, count = vals.shape
    words = np.zeros((m, (count * bits + 63) // 64 + 1), np.uint64)
    v = vals & np.uint64((1 << bits) - 1)
    if count <= _LOOP_COUNT:
        for k in range(count):
            w, s = divmod(k * bits, 64)
            words[:, w] |= v[:, k] << np.uint64(s)
            if s + bits > 64:
                words[:, w + 1] |= v[:, k] >> np.uint64(64 - s)
    else:
        w, s = np.divmod(np.arange(count, dtype=np.uint64) * np.uint64(bits), np.uint64(64))
        np.add.at(words, (slice(None), w.astype(np.int64)), v << s)  # type: ignore[arg-type]  # numpy's stubs: no tuple index
        spill = s + np.uint64(bits) > np.uint64(64)
        np.add.at(words, (slice(None), w[spill].astype(np.int64) + 1),  # type: ignore[arg-type]  # numpy's stubs: no tuple index
                  v[:, spill] >> (np.uint64(64) - s[spill]))
    return words.astype("<u8", copy=False).view(np.uint8)[:, :nbytes]


def _unpack(raw: np.ndarray, bits: int, count: int) -> np.ndarray:
    """The inverse of `_pack`: (m, nbytes) bytes -> (m, count) values of `bits` bits."""
    m = raw.shape[0]
    buf = np.zeros((m, 8 * ((count * bits + 63) // 64 + 1)), np.uint8)
    buf[:, : raw.shape[1]] = raw
    words = buf.view("<u8").astype(np.uint64, copy=False)
    w, s = np.divmod(np.arange(count, dtype=np.uint64) * np.uint64(bits), np.uint64(64))
    w = w.astype(np.int64)
    out = words[:, w] >> s
    spill = s + np.uint64(bits) > np.uint64(64)
    out[:, spill] |= words[:, w[spill] + 1] << (np.uint64(64) - s[spill])
    return out & np.uint64((1 << bits) - 1)


def encode_batch(p: TreeParams, party: int, fields: tuple) -> bytes:
    """A batch's bytes from its logical arrays (`KeyBatch.logical()`)."""
    n = fields[0].shape[-1]
    parts = [p.header(party, batch=True), n.to_bytes(8, "little")]
    for lo in range(0, n, _CHUNK):
        parts.append(_bodies(p, fields, lo, min(n, lo + _CHUNK)).tobytes())
    return b"".join(parts)


def encode_key(p: TreeParams, party: int, fields: tuple) -> bytes:
    """One key's bytes from the logical arrays of a batch of one."""
    return p.header(party) + _bodies(p, fields, 0, 1).tobytes()


def _check_header(p: TreeParams, data: bytes, batch: bool, party: int | None) -> int:
    """Validates a key or batch header against the expected parameters; returns the party."""
    if data[0] != p.version:
        raise KeyFormatError(f"key format version {data[0]}, but {p.describe()} has version {p.version}")
    want_kind = p.kind | (BATCH_FLAG if batch else 0)
    if data[1] != want_kind:
        what = "a key batch" if batch else "a single key"
        raise KeyFormatError(f"kind byte 0x{data[1]:02x} is not {what} of this function family (0x{want_kind:02x})")
    if data[2] not in (0, 1):
        raise KeyFormatError(f"party must be 0 or 1, got {data[2]}")
    if party is not None and data[2] != party:
        raise KeyFormatError(f"key of party {data[2]}, expected party {party}")
    got = (data[3], data[4], data[5], int.from_bytes(data[6:8], "little"))
    want = (p.bits, p.out_bits, p.flags(), p.width)
    if got != want:
        raise KeyFormatError(
            f"key parameters (bits, out_bits, flags, width) = {got} do not match {p.describe()} = {want}"
        )
    return data[2]


def _parse_bodies(p: TreeParams, body: np.ndarray, out: dict[str, np.ndarray], lo: int) -> None:
    """Parses an (m, body_len) uint8 array into the batch arrays at keys lo..lo+m, strictly."""
    m = body.shape[0]
    pos = 0
    out["seeds"][:, lo : lo + m] = body[:, :LAMBDA_BYTES].copy().view("<u8").reshape(m, 2).T
    pos += LAMBDA_BYTES
    cws = body[:, pos : pos + p.bits * LAMBDA_BYTES].copy().view("<u8").reshape(m, p.bits, 2)
    if np.any(cws[:, :, 0] & np.uint64(1)):
        raise KeyFormatError("reserved bit 0 of a seed correction word is set")
    out["cw_seed"][:, :, lo : lo + m] = cws.transpose(1, 2, 0)
    pos += p.bits * LAMBDA_BYTES
    tbits = np.unpackbits(body[:, pos : pos + p.t_bytes], axis=1, bitorder="little")
    if np.any(tbits[:, 2 * p.bits :]):
        raise KeyFormatError("nonzero padding after the control-bit corrections")
    tb = tbits[:, : 2 * p.bits].reshape(m, p.bits, 2)
    out["cw_t"][:, lo : lo + m] = (tb[:, :, 0] | (tb[:, :, 1] << 1)).T
    pos += p.t_bytes
    vraw = body[:, pos : pos + p.v_bytes]
    count = p.v_levels * p.width
    if p.out_bits == 64:
        vals = vraw.copy().view("<u8").reshape(m, count)
    else:
        tail = (count * p.out_bits) % 8
        if tail and np.any(vraw[:, -1] >> np.uint8(tail)):
            raise KeyFormatError("nonzero padding after the payload corrections")
        vals = _unpack(vraw, p.out_bits, count)
    if p.prime and np.any(vals >= np.uint64(p.modulus)):
        raise KeyFormatError("a payload correction is not reduced mod p = 2^61 - 1")
    out["cw_v"][:, :, lo : lo + m] = vals.reshape(m, p.v_levels, p.width).transpose(1, 2, 0)


def _empty_arrays(p: TreeParams, n: int) -> dict[str, np.ndarray]:
    return {
        "seeds": np.empty((2, n), np.uint64),
        "cw_seed": np.empty((p.bits, 2, n), np.uint64),
        "cw_t": np.empty((p.bits, n), np.uint8),
        "cw_v": np.empty((p.v_levels, p.width, n), np.uint64),
    }


def _as_bytes(data: object) -> bytes:
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise KeyFormatError(f"expected bytes, got {type(data).__name__}")
    return bytes(data)


def decode_key(p: TreeParams, data: object, party: int | None = None) -> tuple:
    """Parses one key of parameters `p` (and of `party`, if given) into (party, seeds, cw_seed, cw_t,
    cw_v): the arguments of `KeyBatch.from_logical`; anything else: KeyFormatError."""
    data = _as_bytes(data)
    if len(data) < HEADER_LEN:
        raise KeyFormatError(f"a key is at least {HEADER_LEN} bytes, got {len(data)}")
    got_party = _check_header(p, data, batch=False, party=party)
    if len(data) != p.key_size:
        raise KeyFormatError(f"a key of {p.describe()} is {p.key_size} bytes, got {len(data)}")
    arrays = _empty_arrays(p, 1)
    _parse_bodies(p, np.frombuffer(data, np.uint8, offset=HEADER_LEN).reshape(1, -1), arrays, 0)
    return (got_party, *arrays.values())  # the order of KeyBatch.from_logical's arguments


def decode_batch(p: TreeParams, data: object, party: int | None = None) -> tuple:
    """Parses a key batch of parameters `p` into (party, seeds, cw_seed, cw_t,
    cw_v); anything else: KeyFormatError."""
    data = _as_bytes(data)
    if len(data) < BATCH_HEADER_LEN:
        raise KeyFormatError(f"a key batch is at least {BATCH_HEADER_LEN} bytes, got {len(data)}")
    got_party = _check_header(p, data, batch=True, party=party)
    n = int.from_bytes(data[HEADER_LEN:BATCH_HEADER_LEN], "little")
    if len(data) - BATCH_HEADER_LEN != n * p.body_len:
        raise KeyFormatError(
            f"a batch of {n} keys of {p.describe()} is {BATCH_HEADER_LEN + n * p.body_len} bytes, got {len(data)}"
        )
    arrays = _empty_arrays(p, n)
    bodies = np.frombuffer(data, np.uint8, offset=BATCH_HEADER_LEN).reshape(n, p.body_len)
    for lo in range(0, n, _CHUNK):
        _parse_bodies(p, bodies[lo : lo + _CHUNK], arrays, lo)
    return (got_party, *arrays.values())  # the order of KeyBatch.from_logical's arguments


# --- the header alone, and the grouped fast path -------------------------------------------------
KNOWN_FLAGS = 0x07 | SIGNED_FLAG | PRIME_FLAG


def parse_header(data: object) -> tuple[TreeParams, int, bool]:
    """(params, party, is a batch) of the header a key or a batch starts with: the header names its
    function fully (kind, bits, out_bits, comparison, signed, group, width, format version). Raises
    `KeyFormatError` for fewer than 8 bytes, an unknown version, kind or flag, or parameters no function
    has (bits 0, a DCF with cmp eq, a ring key of version 2, ...)."""
    head = _head(data, HEADER_LEN)
    version, kind_byte, party, bits, out_bits, flags = head[:6]
    width = int.from_bytes(head[6:8], "little")
    if version not in {v for vs in VERSIONS.values() for v in vs}:
        raise KeyFormatError(f"unknown key format version {version} (this release reads versions 1 and 2)")
    batch, kind = bool(kind_byte & BATCH_FLAG), kind_byte & ~BATCH_FLAG
    if kind not in (KIND_DCF, KIND_DPF):
        raise KeyFormatError(f"kind byte 0x{kind_byte:02x} is neither a DCF (1) nor a DPF (2), key or batch (| 0x80)")
    if flags & ~KNOWN_FLAGS or flags & 0x07 not in CMP_NAMES:
        raise KeyFormatError(f"unknown flags 0x{flags:02x} in the key header")
    try:
        p = TreeParams.make(kind, bits, out_bits, width, CMP_NAMES[flags & 0x07], bool(flags & SIGNED_FLAG),
                            "p61" if flags & PRIME_FLAG else "ring", version)
    except ParameterError as exc:
        raise KeyFormatError(f"the header names no function (version {version}): {exc}") from None
    return p, _check_header(p, head, batch, None), batch


def _head(data: object, length: int) -> bytes:
    head = data[:length] if isinstance(data, bytes) else as_buffer(data)[:length].tobytes()
    if len(head) < length:
        raise KeyFormatError(f"a key header is {length} bytes, got {len(head)}")
    return head


def batch_count(p: TreeParams, head: bytes, available: int | None) -> int:
    """The key count of a batch's 16-byte header; with `available` (the bytes after the header), checks
    that they are exactly the count's bodies."""
    n = int.from_bytes(head[HEADER_LEN:BATCH_HEADER_LEN], "little")
    if available is not None and available != n * p.body_len:
        raise KeyFormatError(
            f"a batch of {n} keys of {p.describe()} is {BATCH_HEADER_LEN + n * p.body_len} bytes, got {BATCH_HEADER_LEN + available}"
        )
    return n


def grouped_arrays(p: TreeParams, n: int) -> tuple:
    """Zeroed grouped arrays of n keys (`KeyBatch`'s fields, the last group's padding zero)."""
    g = -(-n // GROUP)
    payload = np.uint32 if p.out_bits <= 32 else np.uint64  # `keys.payload_dtype`
    return (np.zeros((g, 2, GROUP), np.uint64), np.zeros((g, p.bits, 2, GROUP), np.uint64),
            np.zeros((g, p.bits, GROUP), np.uint8), np.zeros((g, p.v_levels, p.width, GROUP), payload))


def encode_into(p: TreeParams, n: int, arrays: tuple, g0: int, g1: int, out: np.ndarray, pos: int) -> int:
    """Writes the bodies of the keys of groups g0 .. g1 - 1 (of n; `arrays` grouped, C-contiguous)
    end to end into the uint8 array `out`, the first at byte `pos`, in this thread; returns the
    position after the last one."""
    from . import _serial

    arrays = tuple(np.ascontiguousarray(a) for a in arrays)  # views as they are (a batch's arrays are C-contiguous)
    return int(_serial.encode(*arrays, n, p.out_bits, g0, g1, out, pos, p.t_bytes, p.v_bytes))


def encode_grouped(p: TreeParams, party: int, n: int, arrays: tuple) -> bytes:
    """A batch's bytes (its header, then every body) from its grouped arrays: one numba pass over
    them, written straight into the bytes object returned (`fss._serial.new_bytes`)."""
    from . import _serial

    arrays = tuple(np.ascontiguousarray(a) for a in arrays)
    data, out = _serial.new_bytes(BATCH_HEADER_LEN + n * p.body_len)
    out[:BATCH_HEADER_LEN] = np.frombuffer(p.header(party, batch=True) + n.to_bytes(8, "little"), np.uint8)
    _serial.encode_all(arrays, n, p.out_bits, out, BATCH_HEADER_LEN, p.body_len, p.t_bytes, p.v_bytes)
    return data if isinstance(data, bytes) else bytes(data)


_FAILURES = {1: "reserved bit 0 of a seed correction word is set", 2: "nonzero padding after the control-bit corrections",
             3: "nonzero padding after the payload corrections", 4: "a payload correction is not reduced mod p = 2^61 - 1"}


def _read_only(data: np.ndarray) -> np.ndarray:
    if data.flags.writeable:  # one compiled kernel: every input read-only
        data = data.view()
        data.flags.writeable = False
    return data


def decode_into(p: TreeParams, data: np.ndarray, pos: int, n: int, g0: int, g1: int, arrays: tuple) -> None:
    """Parses the bodies of keys g0 GROUP .. min(n, g1 GROUP) - 1, end to end in the uint8 array
    `data`, the first at byte `pos`, into the grouped `arrays`, in this thread; KeyFormatError naming
    the first bad key."""
    from . import _serial

    code, k = _serial.decode(_read_only(data), pos, n, g0, g1, p.out_bits, p.prime, *arrays, p.t_bytes, p.v_bytes, 0)
    if code:
        raise KeyFormatError(f"{_FAILURES[int(code)]} (key {int(k)} of the batch)")


def decode_all(p: TreeParams, data: np.ndarray, pos: int, n: int, arrays: tuple, gap: int = 0) -> None:
    """`decode_into` of all n bodies, the first at byte `pos` and each `gap` bytes after the one before,
    the groups split over the kernels' threads."""
    from . import _serial

    code, k = _serial.decode_all(_read_only(data), pos, n, p.out_bits, p.prime, arrays, p.body_len, p.t_bytes, p.v_bytes, gap)
    if code:
        raise KeyFormatError(f"{_FAILURES[int(code)]} (key {int(k)} of the batch)")


def as_buffer(data: object) -> np.ndarray:
    """A read-only uint8 view of bytes, a bytearray, a memoryview or a uint8 numpy array (no copy)."""
    if isinstance(data, np.ndarray) and data.dtype == np.uint8:
        return _read_only(data.reshape(-1))
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise KeyFormatError(f"expected bytes or a uint8 array, got {type(data).__name__}")
    try:
        buf = np.frombuffer(data, np.uint8)
    except (TypeError, ValueError, BufferError) as exc:  # a non-contiguous memoryview (BufferError: review of issue 43)
        raise KeyFormatError(f"expected contiguous bytes ({exc})") from None
    buf.flags.writeable = False
    return buf


def decode_grouped(p: TreeParams, data: object, party: int | None = None) -> tuple:
    """Parses a batch of parameters `p` (and of `party`, if given) into (party, n, seeds, cw_seed, cw_t,
    cw_v), the arguments of `KeyBatch.from_grouped`, in one numba pass; anything else: KeyFormatError."""
    buf = as_buffer(data)
    if buf.size < BATCH_HEADER_LEN:
        raise KeyFormatError(f"a key batch is at least {BATCH_HEADER_LEN} bytes, got {buf.size}")
    head = buf[:BATCH_HEADER_LEN].tobytes()
    got_party = _check_header(p, head, batch=True, party=party)
    n = batch_count(p, head, buf.size - BATCH_HEADER_LEN)
    arrays = grouped_arrays(p, n)
    decode_all(p, buf, BATCH_HEADER_LEN, n, arrays)
    return (got_party, n, *arrays)


def decode_keys(p: TreeParams, data: object, party: int | None = None) -> tuple:
    """Parses n single keys of parameters `p` end to end (each `Key.to_bytes()`, all of one party, and
    of `party` if given) into (party, n, seeds, cw_seed, cw_t, cw_v), the arguments of
    `KeyBatch.from_grouped`, in one numba pass over the bytes where they lie; KeyFormatError for a
    length that is not a whole number of keys, any header that is not the first's, or a bad body."""
    buf = as_buffer(data)
    if buf.size % p.key_size:
        raise KeyFormatError(f"{buf.size} bytes are not a whole number of {p.key_size}-byte keys of {p.describe()}")
    n = buf.size // p.key_size
    if not n and party is None:
        raise KeyFormatError("no keys, so no header that names their party")
    got_party = party
    if n:
        got_party = _check_header(p, buf[:HEADER_LEN].tobytes(), batch=False, party=party)
        heads = buf.reshape(n, p.key_size)[:, :HEADER_LEN]
        if not (heads == np.frombuffer(p.header(got_party), np.uint8)).all():
            bad = int(np.flatnonzero(~(heads == np.frombuffer(p.header(got_party), np.uint8)).all(axis=1))[0])
            raise KeyFormatError(f"key {bad} is not a single key of {p.describe()} for party {got_party} (its header)")
    arrays = grouped_arrays(p, n)
    decode_all(p, buf, HEADER_LEN, n, arrays, gap=HEADER_LEN)
    return (got_party, n, *arrays)
