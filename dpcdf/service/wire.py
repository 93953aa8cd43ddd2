"""The report wire format, shared by the clients that write reports and the servers that read them.

A report holds one DCF key share per server, each HPKE-sealed (RFC 9180 base mode with the task's
KEM, see `hpke`) to its server's key. The context (task fingerprint, report id, server index) is the
HPKE `info`, so a share opens only for its task, its report and its server (RFC 9180 section 8.1:
single-shot APIs bind auxiliary data through info).

Report (all lengths little-endian):
    magic b"DPR1" | task fingerprint (32) | report id (16) |
    for server 0 then 1: len(enc) u16 | enc | len(ciphertext) u32 | ciphertext
A batch: count u32, then len(report) u32 | report for each.
A share's plaintext: the DCF key's bytes, then for a verified task the client's shares of its check
randomness (`split_share`).
Decoding is strict: a wrong magic, a truncated field or trailing bytes are a `ReportError`.
A server reads a batch through `Layout` (every honest report of a task has the same length, so its
framing is checked for the whole batch at once; any other report is parsed by `Report.from_bytes`),
`Opener` and `split_shares`: the same checks and messages as `Report.from_bytes`, `open_share` and
`split_share`, without their Python work per report.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Sequence

import numpy as np
from cryptography.exceptions import InvalidTag

from fss import field

from . import hpke
from ..errors import DpcdfError

MAGIC = b"DPR1"
ID_BYTES = 16
MAX_BATCH = 1 << 16  # reports per batch upload
FOREIGN = "report is for another task"  # also a server's answer for a task id it does not know
NOT_OPENED = "the share does not open with this server's key"
NOT_FIELD = "the share's check values must be field elements (below 2^61 - 1)"
HEAD = 4 + 32 + ID_BYTES  # magic, fingerprint, report id


class ReportError(DpcdfError, ValueError):
    """Bytes that are not a well-formed report (for this task)."""


def hpke_info(fingerprint: bytes, report_id: bytes, party: int) -> bytes:
    return b"dpcdf/report/v1" + fingerprint + report_id + bytes([party])


@dataclass(frozen=True)
class Report:
    fingerprint: bytes
    report_id: bytes
    sealed: tuple[tuple[bytes, bytes], tuple[bytes, bytes]]  # (enc, ciphertext) per server

    def to_bytes(self) -> bytes:
        out = [MAGIC, self.fingerprint, self.report_id]
        for enc, ct in self.sealed:
            out += [struct.pack("<H", len(enc)), enc, struct.pack("<I", len(ct)), ct]
        return b"".join(out)

    @classmethod
    def from_bytes(cls, data: bytes) -> "Report":
        try:
            if data[:4] != MAGIC:
                raise ReportError("not a dpcdf report (bad magic)")
            fp, rid, pos = data[4:36], data[36:52], 52
            if len(rid) != ID_BYTES:
                raise ReportError("truncated report header")
            sealed = []
            for _ in range(2):
                (n_enc,) = struct.unpack_from("<H", data, pos)
                enc = data[pos + 2 : pos + 2 + n_enc]
                pos += 2 + n_enc
                (n_ct,) = struct.unpack_from("<I", data, pos)
                ct = data[pos + 4 : pos + 4 + n_ct]
                pos += 4 + n_ct
                if len(enc) != n_enc or len(ct) != n_ct:
                    raise ReportError("truncated report")
                sealed.append((enc, ct))
            if pos != len(data):
                raise ReportError(f"{len(data) - pos} trailing bytes after the report")
            return cls(fp, rid, (sealed[0], sealed[1]))
        except struct.error:
            raise ReportError("truncated report") from None


def open_share(report: Report, party: int, private_key, fingerprint: bytes, kem: str = "x25519") -> bytes:
    """The server's side: its key share's bytes, or ReportError if the report is for another task
    or does not open with this server's key."""
    if report.fingerprint != fingerprint:
        raise ReportError(FOREIGN)
    enc, ct = report.sealed[party]
    if len(enc) != hpke.enc_length(kem):
        raise ReportError(f"the encapsulated key must be {hpke.enc_length(kem)} bytes for {kem}")
    return Opener(private_key, fingerprint, party, kem)(report.report_id, enc + ct)


class Opener:
    """Opens server `party`'s shares of one task's reports: `opener(report_id, enc + ciphertext)` is
    `open_share` once the caller has checked the fingerprint and the encapsulated key's length (the
    HPKE info is still bound to the task, the report id and the server)."""

    def __init__(self, private_key, fingerprint: bytes, party: int, kem: str = "x25519"):
        self._decrypt, self._key = hpke.suite(kem).decrypt, private_key
        self._head, self._tail = hpke_info(fingerprint, b"", party)[:-1], bytes([party])

    def __call__(self, report_id: bytes, sealed: bytes) -> bytes:
        try:
            return self._decrypt(sealed, self._key, info=self._head + report_id + self._tail)
        except (InvalidTag, ValueError):
            raise ReportError(NOT_OPENED) from None


class Layout:
    """A task's report whose two sealed shares have the task's lengths (every honest report): its
    framing (magic, fingerprint, the four length fields) at fixed offsets."""

    CHUNK = 4096  # reports compared at once (a 4 MiB copy at 2^10 grid points)

    def __init__(self, fingerprint: bytes, enc_len: int, ct_len: int):
        self.enc_len, self.ct_len = enc_len, ct_len
        self.share = 2 + enc_len + 4 + ct_len
        self.size = HEAD + 2 * self.share
        one = struct.pack("<H", enc_len) + bytes(enc_len) + struct.pack("<I", ct_len) + bytes(ct_len)
        template = np.frombuffer(MAGIC + fingerprint + bytes(ID_BYTES) + one + one, np.uint8)
        fixed = [*range(HEAD - ID_BYTES)]
        for at in (HEAD, HEAD + self.share):
            fixed += [*range(at, at + 2), *range(at + 2 + enc_len, at + 6 + enc_len)]
        self._cols = np.array(fixed)
        self._want = template[self._cols]

    def matches(self, raws: Sequence[bytes]) -> list[bool]:
        """Per report, whether it is of this layout: then `Report.from_bytes` would read it, with this
        fingerprint and both shares of these lengths; one vectorized comparison per CHUNK reports."""
        out = [len(r) == self.size for r in raws]
        idx = [i for i, ok in enumerate(out) if ok]
        for lo in range(0, len(idx), self.CHUNK):
            part = idx[lo : lo + self.CHUNK]
            rows = np.frombuffer(b"".join([raws[i] for i in part]), np.uint8).reshape(len(part), self.size)
            for i, ok in zip(part, (rows[:, self._cols] == self._want).all(axis=1).tolist()):
                out[i] = ok
        return out

    def sealed(self, raw: bytes, party: int) -> tuple[bytes, bytes]:
        """(report id, enc + ciphertext of server `party`'s share) of a report of this layout."""
        at = HEAD + party * self.share + 2
        return raw[HEAD - ID_BYTES : HEAD], raw[at : at + self.enc_len] + raw[at + self.enc_len + 4 : at + self.share - 2]


def encode_batch(reports: list[bytes]) -> bytes:
    return struct.pack("<I", len(reports)) + b"".join(struct.pack("<I", len(r)) + r for r in reports)


def decode_batch(data: bytes) -> list[bytes]:
    try:
        (count,) = struct.unpack_from("<I", data, 0)
        if count > MAX_BATCH:
            raise ReportError(f"at most {MAX_BATCH} reports per batch, got {count}")
        pos, out = 4, []
        for _ in range(count):
            (n,) = struct.unpack_from("<I", data, pos)
            item = data[pos + 4 : pos + 4 + n]
            if len(item) != n:
                raise ReportError("truncated batch")
            out.append(item)
            pos += 4 + n
        if pos != len(data):
            raise ReportError("trailing bytes after the batch")
        return out
    except struct.error:
        raise ReportError("truncated batch") from None


def split_share(share: bytes, key_size: int, extras: int) -> tuple[bytes, np.ndarray]:
    """A server's opened share of a report: its key's bytes, then (verified tasks) `extras` field
    elements of the client's check randomness, 8 bytes little-endian each. ReportError for a
    wrong length or an element not below p."""
    if len(share) != key_size + 8 * extras:
        raise ReportError(f"the share must be a {key_size}-byte key and {extras} field elements, got {len(share)} bytes")
    values = np.frombuffer(share, dtype="<u8", count=extras, offset=key_size).astype(np.uint64)
    if (values >= np.uint64(field.P)).any():
        raise ReportError(NOT_FIELD)
    return share[:key_size], values


def split_shares(shares: Sequence[bytes], key_size: int, extras: int) -> tuple[list[int], np.ndarray, dict[int, str]]:
    """`split_share` of many opened shares in one pass: (the indices of those that pass, their keys'
    bytes as rows (m, key_size) uint8, and index -> the error `split_share` raises for the others)."""
    width = key_size + 8 * extras
    bad: dict[int, str] = {}
    fits = []
    for i, share in enumerate(shares):
        if len(share) == width:
            fits.append(i)
        else:
            try:
                split_share(share, key_size, extras)
            except ReportError as exc:
                bad[i] = str(exc)
    rows = np.frombuffer(b"".join([shares[i] for i in fits]), np.uint8).reshape(len(fits), width)
    if extras:
        values = np.ascontiguousarray(rows[:, key_size:]).view("<u8")
        for k in np.flatnonzero((values >= np.uint64(field.P)).any(axis=1)).tolist():
            bad[fits[k]] = NOT_FIELD
    good = [k for k, i in enumerate(fits) if i not in bad]
    return [fits[k] for k in good], rows[good, :key_size] if len(good) < len(fits) else rows[:, :key_size], bad


def join_share(key: bytes, extras: np.ndarray) -> bytes:
    """The inverse of split_share (the client's side)."""
    return key + np.asarray(extras, dtype="<u8").tobytes()
