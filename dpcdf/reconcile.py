"""How the two servers agree on one report set without the analyst learning anything about it.

A report whose upload reached one server only (a client that crashed between its two uploads, or a
malicious one) would make the servers' sums differ for good: the shares no longer cancel. At the
close, the servers compare their sets in 2^16 buckets, through the analyst, in messages the analyst
can neither read nor forge, and both drop the buckets that differ (losing about n / 65536 reports per
one-sided report, all of which stay stored). Every message has a fixed length, so the analyst learns
nothing about the number of reports (under add/remove it is not public).

The key: both servers' X25519 keys are in the task config, and each server checked its own at
registration, so they share K = HKDF(X25519(own, peer), salt = the task fingerprint), which the analyst
cannot compute.
- The report-set hash in every answer is HMAC(K, sorted report ids): the analyst can compare the two
  servers' hashes but not test a guessed set against them (a plain hash let an analyst who knows
  everyone else's report ids tell whether one more person had reported).
- A report's bucket: the first two bytes of HMAC(K, "bucket" || id).
- Server 0's message: AES-GCM under K of its 2^16 bucket digests; server 1's reply: AES-GCM under K of
  the bitmap of buckets that differ. The direction and the fingerprint are the associated data.
"""
from __future__ import annotations

import hashlib
import hmac
import secrets

import numpy as np
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import x25519
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from .errors import DpcdfError

BUCKET_BYTES = 2
BUCKETS = 1 << (8 * BUCKET_BYTES)
DIGEST = 16
_NONCE = 12


class SyncError(DpcdfError):
    """A reconciliation message that does not open under the servers' shared key."""


def pair_key(own: x25519.X25519PrivateKey, peer_public: bytes, fingerprint: bytes) -> bytes:
    """K = HKDF-SHA256(X25519(own, peer), salt = fingerprint): the same on both servers, per task."""
    shared = own.exchange(x25519.X25519PublicKey.from_public_bytes(peer_public))
    return HKDF(hashes.SHA256(), 32, salt=fingerprint, info=b"dpcdf reconcile v1").derive(shared)


def set_hash(key: bytes, ids: list[bytes]) -> str:
    """HMAC(K, sorted report ids), hex."""
    return hmac.new(key, b"".join(sorted(ids)), hashlib.sha256).hexdigest()


def buckets(key: bytes, ids: list[bytes]) -> np.ndarray:
    """Each report id's bucket in [0, BUCKETS)."""
    return np.array([int.from_bytes(hmac.new(key, b"bucket" + i, hashlib.sha256).digest()[:BUCKET_BYTES], "big")
                     for i in ids], dtype=np.int64)


def bucket_digests(key: bytes, ids: list[bytes]) -> bytes:
    """BUCKETS digests of DIGEST bytes: HMAC(K, bucket || its sorted ids), one per bucket."""
    which = buckets(key, ids)
    members: dict[int, list[bytes]] = {}
    for b, i in zip(which.tolist(), ids):
        members.setdefault(b, []).append(i)
    out = bytearray()
    for b in range(BUCKETS):
        data = b.to_bytes(BUCKET_BYTES, "big") + b"".join(sorted(members.get(b, [])))
        out += hmac.new(key, data, hashlib.sha256).digest()[:DIGEST]
    return bytes(out)


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


def seal(key: bytes, sender: int, fingerprint: bytes, payload: bytes) -> str:
    nonce = secrets.token_bytes(_NONCE)
    return (nonce + AESGCM(key).encrypt(nonce, payload, _aad(sender, fingerprint))).hex()


def open_sealed(key: bytes, sender: int, fingerprint: bytes, message: object, length: int) -> bytes:
    """The payload of a message from server `sender`, or SyncError (not hex, forged, wrong task or
    direction, or not `length` bytes long)."""
    try:
        raw = bytes.fromhex(message) if isinstance(message, str) else None
    except ValueError:
        raw = None
    if raw is None or len(raw) < _NONCE:
        raise SyncError("the sync message must be the hex string the other server sent")
    try:
        payload = AESGCM(key).decrypt(raw[:_NONCE], raw[_NONCE:], _aad(sender, fingerprint))
    except InvalidTag:
        raise SyncError(f"the sync message is not server {sender}'s for this task") from None
    if len(payload) != length:
        raise SyncError("the sync message has the wrong length")
    return payload


def _aad(sender: int, fingerprint: bytes) -> bytes:
    return b"dpcdf sync from %d:" % sender + fingerprint
