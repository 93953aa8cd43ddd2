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
"""
from __future__ import annotations

import struct
from dataclasses import dataclass

import numpy as np
from cryptography.exceptions import InvalidTag

from fss import field

from . import hpke
from ..errors import DpcdfError

MAGIC = b"DPR1"
ID_BYTES = 16
MAX_BATCH = 1 << 16  # reports per batch upload
FOREIGN = "report is for another task"  # also a server's answer for a task id it does not know


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
    try:
        return hpke.suite(kem).decrypt(enc + ct, private_key, info=hpke_info(fingerprint, report.report_id, party))
    except (InvalidTag, ValueError):
        raise ReportError("the share does not open with this server's key") from None


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
        raise ReportError("the share's check values must be field elements (below 2^61 - 1)")
    return share[:key_size], values


def join_share(key: bytes, extras: np.ndarray) -> bytes:
    """The inverse of split_share (the client's side)."""
    return key + np.asarray(extras, dtype="<u8").tobytes()
