"""How the two servers agree on one report set without the analyst learning anything about it.

A report whose upload reached one server only (a client that crashed between its two uploads) would
make the servers' sums differ for good: the shares no longer cancel. At the close, the servers find
and drop exactly those reports, through the analyst, in messages the analyst can neither read nor
forge, all of fixed length. A server answers queries, and shows its report-set hash and count, only
once its part is done, so the analyst sees no intermediate state either. (This repairs crashes, not
malicious clients: a well-formed report with mismatched shares is not detected; see the README.)

The key: both servers' X25519 keys are in the task config (each server checks its own, and that the
other's is a valid key, at registration), so they share K = HKDF(X25519(own, peer), salt = the task
fingerprint), which the analyst cannot compute.
- Each report id gets a pseudorandom value: AES-128 under a key derived from K (a PRF).
- The report-set hash is an HMAC under K of the count and the XOR of the ids' values: the analyst can
  compare the two servers' hashes but not test a guessed set against them (a plain hash let an analyst
  who knows everyone else's report ids tell whether one more person had reported).
- A report's bucket (of 2^16): the first two bytes of its value.
The four messages, each AES-GCM under K with its round and the fingerprint as associated data:
1. server 0 -> 1: its bucket digests (the XOR of its ids' values under a second PRF key, 16 bytes each);
2. server 1 -> 0: the buckets that differ and its report ids in each (up to SLOT ids, padded); if more
   than LISTED buckets differ, or one holds more than SLOT ids, server 1 refuses and the task stays
   closed and unanswered (dropping whole buckets instead would drop honest reports, and whether it
   did would depend on them: a review showed it telling an empty set from a non-empty one);
3. server 0 -> 1: server 1's listed ids that server 0 lacks (padded); server 0 drops its own reports
   in the listed buckets that server 1 lacks, and is done;
4. server 1 drops the ids of message 3, and is done.
`step` plays one server's part of this exchange; the server's close handler only relays it.
So each one-sided report costs exactly itself; whether the close succeeds depends on the one-sided
reports alone (up to 64 of them always succeed; honest reports matter only if one of the differing
buckets also holds more than 64 - k of them, which at n = 10^6, 15 per bucket on average, does not
happen).
"""
from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass

import numpy as np
from Crypto.Cipher import AES
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import x25519
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from ..errors import DpcdfError

BUCKET_BYTES = 2
BUCKETS = 1 << (8 * BUCKET_BYTES)
DIGEST = 16
ID_BYTES = 16
LISTED = 64  # differing buckets whose ids message 2 lists
SLOT = 64  # ids per listed bucket
_NONCE = 12
ROUND_LENGTHS = {1: BUCKETS * DIGEST, 2: BUCKETS // 8 + LISTED * (2 + SLOT * ID_BYTES), 3: 4 + LISTED * SLOT * ID_BYTES}


class SyncError(DpcdfError):
    """A reconciliation message that does not open under the servers' shared key."""


class TooManyDifferences(DpcdfError):
    """More differing buckets than message 2 lists, or a differing bucket with more than SLOT ids."""


def pair_key(own: x25519.X25519PrivateKey, peer_public: bytes, fingerprint: bytes) -> bytes:
    """K = HKDF-SHA256(X25519(own, peer), salt = fingerprint): the same on both servers, per task."""
    shared = own.exchange(x25519.X25519PublicKey.from_public_bytes(peer_public))
    return HKDF(hashes.SHA256(), 32, salt=fingerprint, info=b"dpcdf reconcile v1").derive(shared)


def _prf(key: bytes, ids: list[bytes]) -> np.ndarray:
    """AES-128 under a key derived from K, on each 16-byte id: (n, 16) pseudorandom bytes per id
    (one ECB call for all of them: the close of 10^6 reports takes well under a second)."""
    aes = AES.new(_subkey(key, b"prf")[:16], AES.MODE_ECB)
    return np.frombuffer(aes.encrypt(b"".join(ids)), np.uint8).reshape(len(ids), ID_BYTES)


def set_hash(key: bytes, ids: list[bytes]) -> str:
    """HMAC(K, count || XOR of the ids' PRF values), hex: equal for equal sets, and no one without K
    can compute it for a guessed set."""
    xor = np.bitwise_xor.reduce(_prf(key, ids), axis=0) if ids else np.zeros(ID_BYTES, np.uint8)
    return hmac.new(_subkey(key, b"set hash"), len(ids).to_bytes(8, "big") + xor.tobytes(), hashlib.sha256).hexdigest()


def buckets(key: bytes, ids: list[bytes]) -> np.ndarray:
    """Each report id's bucket in [0, BUCKETS): the first two bytes of its PRF value."""
    if not ids:
        return np.zeros(0, np.int64)
    block = _prf(key, ids)
    return block[:, 0].astype(np.int64) << 8 | block[:, 1]


def members(ids: list[bytes], which: np.ndarray, wanted) -> dict[int, list[bytes]]:
    """The ids in each wanted bucket (`which` holds each id's bucket)."""
    out: dict[int, list[bytes]] = {int(b): [] for b in wanted}
    for k in np.flatnonzero(np.isin(which, np.asarray(list(out), dtype=np.int64))):
        out[int(which[k])].append(ids[k])
    return out


def bucket_digests(key: bytes, ids: list[bytes]) -> bytes:
    """BUCKETS digests of DIGEST bytes: per bucket, the XOR of its ids' values under a second PRF key."""
    out = np.zeros((BUCKETS, DIGEST), np.uint8)
    if ids:
        values = _prf(_subkey(key, b"digest"), ids)
        np.bitwise_xor.at(out, buckets(key, ids), values)
    return out.tobytes()


def differing(mine: bytes, theirs: bytes) -> np.ndarray:
    """The buckets whose digests differ."""
    a = np.frombuffer(mine, np.uint8).reshape(BUCKETS, DIGEST)
    b = np.frombuffer(theirs, np.uint8).reshape(BUCKETS, DIGEST)
    return np.flatnonzero((a != b).any(axis=1))


def bitmap(bucket_list: np.ndarray) -> bytes:
    bits = np.zeros(BUCKETS, np.uint8)
    bits[np.asarray(bucket_list, np.int64)] = 1
    return np.packbits(bits).tobytes()


def from_bitmap(data: bytes) -> np.ndarray:
    return np.flatnonzero(np.unpackbits(np.frombuffer(data, np.uint8)))


def id_table(differ: np.ndarray, grouped: dict[int, list[bytes]]) -> bytes:
    """Per differing bucket: a u16 count and its ids, padded to SLOT ids, LISTED buckets in all.
    Raises TooManyDifferences where that does not fit (dropping whole buckets instead would drop
    honest reports, see the module docstring)."""
    if differ.size > LISTED or any(len(grouped[b]) > SLOT for b in differ.tolist()):
        raise TooManyDifferences(f"the servers' report sets differ in more than {LISTED} places (reports that "
                                 "reached one server only): the task cannot be reconciled")
    out = bytearray()
    for b in differ.tolist():
        ids = grouped[b]
        out += len(ids).to_bytes(2, "big") + b"".join(ids) + bytes((SLOT - len(ids)) * ID_BYTES)
    return bytes(out) + bytes((LISTED - differ.size) * (2 + SLOT * ID_BYTES))


def read_id_table(data: bytes, differ: np.ndarray) -> dict[int, set[bytes]]:
    """The inverse of id_table: bucket -> its ids (SyncError if more buckets differ than it lists)."""
    if differ.size > LISTED:
        raise SyncError("the sync message lists too few buckets")
    out, size = {}, 2 + SLOT * ID_BYTES
    for k, b in enumerate(differ.tolist()):
        cell = data[k * size:(k + 1) * size]
        count = min(int.from_bytes(cell[:2], "big"), SLOT)
        out[b] = {cell[2 + j * ID_BYTES:2 + (j + 1) * ID_BYTES] for j in range(count)}
    return out


def id_list(ids: list[bytes]) -> bytes:
    """A u32 count and the ids, padded to LISTED * SLOT ids (message 3)."""
    return len(ids).to_bytes(4, "big") + b"".join(ids) + bytes((LISTED * SLOT - len(ids)) * ID_BYTES)


def read_id_list(data: bytes) -> list[bytes]:
    count = min(int.from_bytes(data[:4], "big"), LISTED * SLOT)
    return [data[4 + j * ID_BYTES:4 + (j + 1) * ID_BYTES] for j in range(count)]


def seal(key: bytes, rnd: int, fingerprint: bytes, payload: bytes) -> str:
    """Message `rnd` (1, 2 or 3): its round byte, then nonce and AES-GCM ciphertext, hex."""
    nonce = secrets.token_bytes(_NONCE)
    return (bytes([rnd]) + nonce + AESGCM(_subkey(key, b"aead")).encrypt(nonce, payload, _aad(rnd, fingerprint))).hex()


def open_sealed(key: bytes, fingerprint: bytes, message: object, expected: tuple[int, ...]) -> tuple[int, bytes]:
    """(round, payload) of a message of one of the `expected` rounds, or SyncError (not hex, forged,
    another task's or round's, or of the wrong length)."""
    try:
        raw = bytes.fromhex(message) if isinstance(message, str) else None
    except ValueError:
        raw = None
    if raw is None or len(raw) < 1 + _NONCE:
        raise SyncError("the sync message must be the hex string the other server sent")
    rnd = raw[0]
    if rnd not in expected:
        raise SyncError(f"this server takes sync messages of round {' or '.join(map(str, expected))} here, not {rnd}")
    try:
        payload = AESGCM(_subkey(key, b"aead")).decrypt(raw[1:1 + _NONCE], raw[1 + _NONCE:], _aad(rnd, fingerprint))
    except InvalidTag:
        raise SyncError("the sync message is not the other server's for this task") from None
    if len(payload) != ROUND_LENGTHS[rnd]:
        raise SyncError("the sync message has the wrong length")
    return rnd, payload


@dataclass(frozen=True)
class Step:
    """One server's move: the message for the analyst to relay (None after the last), the reports
    this server drops now, and whether its part is done (it may then answer queries)."""

    reply: str | None
    drop: frozenset[bytes]
    done: bool


def step(key: bytes, fingerprint: bytes, party: int, ids: list[bytes], sync: str | None) -> Step:
    """Server `party`'s answer to the relayed message `sync` (None: the close starts) over its frozen
    report ids: server 0 sends 1; server 1 answers 1 with 2; server 0 answers 2 with 3, dropping its
    one-sided reports; server 1 drops those listed in 3. Raises SyncError for a message out of turn,
    forged or of another task, and TooManyDifferences where message 2 cannot list the differences."""
    if sync is None:
        if party != 0:
            raise SyncError("server 1 closes with server 0's sync message")
        return Step(seal(key, 1, fingerprint, bucket_digests(key, ids)), frozenset(), False)
    if party == 1:
        rnd, payload = open_sealed(key, fingerprint, sync, (1, 3))
        if rnd == 3:
            return Step(None, frozenset(read_id_list(payload)) & frozenset(ids), True)
        differ = differing(bucket_digests(key, ids), payload)
        grouped = members(ids, buckets(key, ids), differ)
        return Step(seal(key, 2, fingerprint, bitmap(differ) + id_table(differ, grouped)), frozenset(), False)
    _, payload = open_sealed(key, fingerprint, sync, (2,))
    differ = from_bitmap(payload[:BUCKETS // 8])
    theirs = read_id_table(payload[BUCKETS // 8:], differ)
    grouped = members(ids, buckets(key, ids), differ)
    drop: set[bytes] = set()
    they_drop: set[bytes] = set()
    for b in differ.tolist():
        drop |= set(grouped[b]) - theirs[b]
        they_drop |= theirs[b] - set(grouped[b])
    return Step(seal(key, 3, fingerprint, id_list(sorted(they_drop))), frozenset(drop), True)


def _subkey(key: bytes, label: bytes) -> bytes:
    """One key per use of K (PRF, set hash, digests, AEAD): HMAC(K, label)."""
    return hmac.new(key, label, hashlib.sha256).digest()


def _aad(rnd: int, fingerprint: bytes) -> bytes:
    return b"dpcdf sync round %d:" % rnd + fingerprint
