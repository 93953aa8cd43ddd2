"""The report wire format, shared by the clients that write reports and the servers that read them.

A report holds one DCF key share per server, each sealed to its server's key. Format 2 (made now):
the reports of one `make_reports` call (at most MAX_BATCH of them) share, per server, a *capsule*:
a fresh random AES-128 key HPKE-sealed to that server (RFC 9180 base mode with the task's KEM, see
`hpke`; info binds the task fingerprint and the server). Each share is AES-128-GCM under that key,
its nonce the report id's first 12 bytes (distinct within a capsule: the client draws them so) and
its associated data the task fingerprint, the report id and the server index. So a share opens only
for its task, its report and its server, as with one HPKE seal per share (format 1, still read: a
spool of an earlier release holds it), but the elliptic-curve work (two scalar multiplications to
seal, one to open) is done once per capsule, not per report: a server opens each capsule once per
request. What this costs: reports sharing a capsule are linkable by either server as made by one
call (each report carries both capsules), also when they arrive in different requests (retries, a
spool resumed later, from elsewhere); the DP guarantee does not depend on it. A client that wants
its reports unlinkable (one person per report, sent through a proxy) makes each in a call of its
own (`dpcdf submit --batch 1`). And making many valid reports is now cheap for a client (AES-GCM
per report): a server's defence against a flood of well-formed reports is not the sealing's cost.

Report (all lengths little-endian):
    magic b"DPR2" | task fingerprint (32) | report id (16) |
    for server 0 then 1: len(capsule) u16 | capsule | len(ciphertext) u32 | ciphertext
capsule = HPKE enc | HPKE ciphertext of the 16-byte key (32); ciphertext = AES-128-GCM(share) | tag.
Format 1 (magic b"DPR1"): the same framing with capsule = HPKE enc and ciphertext = the share
HPKE-sealed on its own, info = `hpke_info` (task, report id, server).
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
from typing import Callable, Optional, Sequence

import numpy as np
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from fss import field

from . import hpke
from ..errors import DpcdfError

MAGIC = b"DPR2"  # reports made now
MAGIC_V1 = b"DPR1"  # one HPKE seal per share: still read
ID_BYTES = 16
NONCE_BYTES = 12  # the report id's first bytes are its share's AES-GCM nonce
KEY_BYTES = 16  # the capsule's AES-128 key
TAG_BYTES = 16  # AES-128-GCM's tag (after the capsule's key and after each share)
MAX_BATCH = 1 << 16  # reports per batch upload
FOREIGN = "report is for another task"  # also a server's answer for a task id it does not know
TAKEN = "report id taken by other content"  # a server holds another share under this id (issue 42)
NOT_OPENED = "the share does not open with this server's key"
NOT_FIELD = "the share's check values must be field elements (below 2^61 - 1)"
HEAD = 4 + 32 + ID_BYTES  # magic, fingerprint, report id


class ReportError(DpcdfError, ValueError):
    """Bytes that are not a well-formed report (for this task)."""


def hpke_info(fingerprint: bytes, report_id: bytes, party: int) -> bytes:
    """Format 1: the HPKE info of one share's seal."""
    return b"dpcdf/report/v1" + fingerprint + report_id + bytes([party])


def capsule_info(fingerprint: bytes, party: int) -> bytes:
    """Format 2: the HPKE info of a capsule's key (its task and server)."""
    return b"dpcdf/report-key/v2" + fingerprint + bytes([party])


def share_aad(fingerprint: bytes, report_id: bytes, party: int) -> bytes:
    """Format 2: a share's AES-GCM associated data (its task, report and server)."""
    return b"dpcdf/report/v2" + fingerprint + report_id + bytes([party])


def capsule_length(kem: str, version: int = 2) -> int:
    """What precedes a share's ciphertext: format 2's capsule, format 1's HPKE enc."""
    return hpke.enc_length(kem) + (KEY_BYTES + TAG_BYTES if version == 2 else 0)


class Sealer:
    """The client's side of format 2 for one server: a fresh capsule (a random key sealed to the
    server), then `seal(report_id, share)` per report. The caller gives each report of a capsule an
    id whose first NONCE_BYTES are its own (AES-GCM's nonce must not repeat under a key) and starts
    a new Sealer after MAX_BATCH reports."""

    def __init__(self, public_key, fingerprint: bytes, party: int, kem: str = "x25519"):
        key = AESGCM.generate_key(bit_length=8 * KEY_BYTES)  # os.urandom: a CSPRNG
        self.capsule = hpke.suite(kem).encrypt(key, public_key, info=capsule_info(fingerprint, party))
        self._encrypt, self._aad = AESGCM(key).encrypt, share_aad(fingerprint, b"", party)[:-1]
        self._party = bytes([party])

    def seal(self, report_id: bytes, share: bytes) -> bytes:
        return self._encrypt(report_id[:NONCE_BYTES], share, self._aad + report_id + self._party)


@dataclass(frozen=True)
class Report:
    fingerprint: bytes
    report_id: bytes
    sealed: tuple[tuple[bytes, bytes], tuple[bytes, bytes]]  # (capsule, ciphertext) per server
    version: int = 2  # 1: (HPKE enc, HPKE ciphertext) per server

    def to_bytes(self) -> bytes:
        out = [MAGIC if self.version == 2 else MAGIC_V1, self.fingerprint, self.report_id]
        for enc, ct in self.sealed:
            out += [struct.pack("<H", len(enc)), enc, struct.pack("<I", len(ct)), ct]
        return b"".join(out)

    @classmethod
    def from_bytes(cls, data: bytes) -> "Report":
        try:
            if data[:4] not in (MAGIC, MAGIC_V1):
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
            return cls(fp, rid, (sealed[0], sealed[1]), 2 if data[:4] == MAGIC else 1)
        except struct.error:
            raise ReportError("truncated report") from None


def open_share(report: Report, party: int, private_key, fingerprint: bytes, kem: str = "x25519") -> bytes:
    """The server's side: its key share's bytes, or ReportError if the report is for another task
    or does not open with this server's key."""
    if report.fingerprint != fingerprint:
        raise ReportError(FOREIGN)
    capsule, ct = report.sealed[party]
    want = capsule_length(kem, report.version)
    if len(capsule) != want:
        raise ReportError(f"the {'capsule' if report.version == 2 else 'encapsulated key'} must be {want} bytes for {kem}")
    return Opener(private_key, fingerprint, party, kem)(report.report_id, capsule, ct, report.version)


_Decrypt = Callable[[bytes, bytes, Optional[bytes]], bytes]  # AESGCM.decrypt: (nonce, ciphertext, associated data)


class Opener:
    """Opens server `party`'s shares of one task's reports: `opener(report_id, capsule, ciphertext,
    version)` is `open_share` once the caller has checked the fingerprint and the capsule's length
    (the key's HPKE info is still bound to the task and the server, the share's associated data to
    the task, the report id and the server). A format 2 capsule is opened once (one HPKE open) and
    its key kept while it is among the last CAPSULES used; one that does not open refuses every share
    under it. (Bounded: a batch of reports under 65,536 distinct capsules, resent as duplicates that
    are never charged as failures, held 162 MB of AES-GCM contexts for the request; now it costs an
    HPKE open per report, as format 1 does. Security review of format 2.)"""

    CAPSULES = 64

    def __init__(self, private_key, fingerprint: bytes, party: int, kem: str = "x25519"):
        self._decrypt, self._key = hpke.suite(kem).decrypt, private_key
        self._head, self._tail = hpke_info(fingerprint, b"", party)[:-1], bytes([party])
        self._capsule_info, self._aad = capsule_info(fingerprint, party), share_aad(fingerprint, b"", party)[:-1]
        self._keys: dict[bytes, _Decrypt | None] = {}  # capsule -> its AESGCM's decrypt, or None: does not open

    def __call__(self, report_id: bytes, capsule: bytes, ciphertext: bytes, version: int = 2) -> bytes:
        try:
            if version == 1:
                return self._decrypt(capsule + ciphertext, self._key, info=self._head + report_id + self._tail)
            if capsule not in self._keys:
                if len(self._keys) >= self.CAPSULES:
                    del self._keys[next(iter(self._keys))]  # the first one in: a request's capsules come in runs
                self._keys[capsule] = self._open_capsule(capsule)
            decrypt = self._keys[capsule]
            if decrypt is None:
                raise ReportError(NOT_OPENED)
            return decrypt(report_id[:NONCE_BYTES], ciphertext, self._aad + report_id + self._tail)
        except (InvalidTag, ValueError):
            raise ReportError(NOT_OPENED) from None

    def _open_capsule(self, capsule: bytes) -> _Decrypt | None:
        try:
            key = self._decrypt(capsule, self._key, info=self._capsule_info)
        except (InvalidTag, ValueError):
            return None
        return AESGCM(key).decrypt if len(key) == KEY_BYTES else None


class Layout:
    """A task's format 2 report whose two sealed shares have the task's lengths (every honest report
    made now): its framing (magic, fingerprint, the four length fields) at fixed offsets."""

    CHUNK = 4096  # reports compared at once (a 4 MiB copy at 2^10 grid points)

    def __init__(self, fingerprint: bytes, capsule_len: int, ct_len: int):
        self.capsule_len, self.ct_len = capsule_len, ct_len
        self.share = 2 + capsule_len + 4 + ct_len
        self.size = HEAD + 2 * self.share
        one = struct.pack("<H", capsule_len) + bytes(capsule_len) + struct.pack("<I", ct_len) + bytes(ct_len)
        template = np.frombuffer(MAGIC + fingerprint + bytes(ID_BYTES) + one + one, np.uint8)
        fixed = [*range(HEAD - ID_BYTES)]
        for at in (HEAD, HEAD + self.share):
            fixed += [*range(at, at + 2), *range(at + 2 + capsule_len, at + 6 + capsule_len)]
        self._cols = np.array(fixed)
        self._want = template[self._cols]

    def matches(self, raws: Sequence[bytes]) -> list[bool]:
        """Per report, whether it is of this layout: then `Report.from_bytes` would read it as format
        2, with this fingerprint and both shares of these lengths; one vectorized comparison per CHUNK
        reports."""
        out = [len(r) == self.size for r in raws]
        idx = [i for i, ok in enumerate(out) if ok]
        for lo in range(0, len(idx), self.CHUNK):
            part = idx[lo : lo + self.CHUNK]
            rows = np.frombuffer(b"".join([raws[i] for i in part]), np.uint8).reshape(len(part), self.size)
            for i, ok in zip(part, (rows[:, self._cols] == self._want).all(axis=1).tolist()):
                out[i] = ok
        return out

    def sealed(self, raw: bytes, party: int) -> tuple[bytes, bytes, bytes]:
        """(report id, capsule, ciphertext) of server `party`'s share of a report of this layout."""
        at = HEAD + party * self.share + 2
        mid = at + self.capsule_len
        return raw[HEAD - ID_BYTES : HEAD], raw[at:mid], raw[mid + 4 : at + self.share - 2]


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
