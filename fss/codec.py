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
version, kind, party, parameters, reserved bits or padding.
"""
from __future__ import annotations

from ._lazy import numpy as _numpy

from .errors import KeyFormatError
from .params import BATCH_FLAG, BATCH_HEADER_LEN, HEADER_LEN, LAMBDA_BYTES, TreeParams

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
        np.add.at(words, (slice(None), w.astype(np.int64)), v << s)
        spill = s + np.uint64(bits) > np.uint64(64)
        np.add.at(words, (slice(None), w[spill].astype(np.int64) + 1), v[:, spill] >> (np.uint64(64) - s[spill]))
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
