"""How the two servers agree on one report set at the close, whatever the number of reports that
reached one server only, without the analyst learning anything about it.

A report whose upload reached one server only (a client that crashed between its two uploads, and
never resumed from its spool) would make the servers' sums differ for good: the shares no longer
cancel. At the close, server 0 (the leader) talks to server 1 (the helper) directly (POST
/tasks/{id}/sync, the DAP leader/helper pattern), in messages only the two servers can read or make,
and both drop exactly those reports. A server answers queries, and shows its report-set hash and
count, only once its part is done. (This repairs crashes, not malicious clients: see the README.)

The key: both servers' X25519 keys are in the task config (each server checks its own, and that the
other's is a valid key, at registration), so they share K = HKDF(X25519(own, peer), salt = the task
fingerprint), which neither the analyst nor a client can compute. Every message goes through the
task's `protocols.channel.Channel` (AES-GCM under a subkey of K, its kind, chunk and the task's
fingerprint as associated data): that authenticates each server to the other for this task, with no
further credential, and each step is answered once (the channel's one-shot rule).
- Each report id gets a pseudorandom value: AES-128 under a key derived from K (a PRF).
- The report-set hash is an HMAC under K of the count and the XOR of the ids' values: the analyst can
  compare the two servers' hashes but not test a guessed set against them (a plain hash let an analyst
  who knows everyone else's report ids tell whether one more person had reported).
- A report's bucket (of 2^16): the first two bytes of its value.
The messages (no cap on the number of differences: they never pass through the analyst):
1. server 0 -> 1: its bucket digests (the XOR of its ids' values under a second PRF key, 16 bytes each);
2. server 1 -> 0 (the answer): the buckets whose digests differ, and all of its report ids in each;
3. server 0 -> 1: server 1's listed ids that server 0 lacks, in chunks of CHUNK_IDS (so no request
   outgrows the body limit), each with the keyed hash of server 0's set after its own drops (server 0
   drops its reports in the listed buckets that server 1 lacks);
4. server 1 -> 0 (the answer to each chunk): after dropping the chunk's ids, the chunk's index and
   digest and the hash of its own set. Each server is done only when the two hashes are equal, so a
   lost, replayed or reordered message can delay the close, never end it on two different sets.
This module is the exchange's arithmetic on plaintext payloads (`differences`, `drops`,
`take_drops`, `check_ack`); `protocols.reconciliation.exchange` plays each server's part through the channel,
and the servers' HTTP handlers only carry the messages.

What each party learns. Report ids are 16 random bytes, independent of the values, so: server 0 learns
server 1's ids in the differing buckets and which of its own reports are one-sided, server 1 which of
its reports server 0 lacks, neither anything about a value. The analyst learns only the outcome: n
(under substitution, where it is public) and the set hash, which is equal on both servers exactly when
they hold one set; a one-sided report changes neither what the analyst sees after the close (beyond
n) nor whether it succeeds. (While collecting, under substitution, each server's status shows its own
count, so the analyst can see how many uploads reached one server only so far: crashed uploads,
nothing about values; between the freeze and the end of the exchange it shows none.) Every report both servers hold is kept (only ids one server lacks are dropped).
Re-running the exchange is safe at any point (a server crashed mid-close, a message resent): every
step is journalled on both sides and replayed, never answered afresh (`protocols.channel`).
"""
from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass

import numpy as np
from Crypto.Cipher import AES
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import x25519
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from ....errors import DpcdfError

BUCKET_BYTES = 2
BUCKETS = 1 << (8 * BUCKET_BYTES)
DIGEST = 16
ID_BYTES = 16
CHUNK_IDS = 1 << 20  # report ids per part of message 3: 16 MiB, well under a server's 64 MiB body limit


class SyncError(DpcdfError):
    """A reconciliation message that does not open under the servers' shared key."""


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


def bucket_digests(key: bytes, ids: list[bytes], which: np.ndarray | None = None) -> bytes:
    """BUCKETS digests of DIGEST bytes: per bucket, the XOR of its ids' values under a second PRF key.
    `which`: the ids' buckets, if the caller has them. (The XOR runs on 64-bit words, the same bytes.)"""
    out = np.zeros((BUCKETS, DIGEST // 8), np.uint64)
    if ids:
        values = _prf(_subkey(key, b"digest"), ids).view(np.uint64)
        np.bitwise_xor.at(out, buckets(key, ids) if which is None else which, values)
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
    """Per differing bucket (in order): a u32 count and its ids."""
    return b"".join(len(grouped[b]).to_bytes(4, "big") + b"".join(grouped[b]) for b in differ.tolist())


def read_id_table(data: bytes, differ: np.ndarray) -> dict[int, set[bytes]]:
    """The inverse of id_table: bucket -> its ids; SyncError if the lengths do not add up."""
    out, pos = {}, 0
    for b in differ.tolist():
        count = int.from_bytes(data[pos:pos + 4], "big")
        cell = data[pos + 4:pos + 4 + count * ID_BYTES]
        if len(cell) != count * ID_BYTES:
            raise SyncError("the sync message is truncated")
        out[b] = {cell[j:j + ID_BYTES] for j in range(0, len(cell), ID_BYTES)}
        pos += 4 + len(cell)
    if pos != len(data):
        raise SyncError("the sync message has trailing bytes")
    return out


def id_list(ids: list[bytes]) -> bytes:
    return b"".join(ids)


def read_id_list(data: bytes) -> list[bytes]:
    if len(data) % ID_BYTES:
        raise SyncError("the sync message is not a list of report ids")
    return [data[j:j + ID_BYTES] for j in range(0, len(data), ID_BYTES)]


@dataclass(frozen=True)
class Drops:
    """Server 0's move on message 2: the reports it drops (its own that server 1 lacks), and message 3
    in chunks (`bodies`) with the exact acknowledgement each must get (`acks`)."""
    drop: frozenset[bytes]
    bodies: tuple[bytes, ...]
    acks: tuple[bytes, ...]


@dataclass(frozen=True)
class Taken:
    """Server 1's move on a chunk of message 3: the reports it drops, its acknowledgement (message 4),
    and whether it is done (the chunk was the last and its set hash equals server 0's)."""
    drop: frozenset[bytes]
    ack: bytes
    done: bool


def differences(key: bytes, ids: list[bytes], digests: bytes) -> bytes:
    """Message 2 (server 1's answer to server 0's bucket digests): the differing buckets' bitmap and
    server 1's ids in each."""
    if len(digests) != BUCKETS * DIGEST:
        raise SyncError("the sync message has the wrong length")
    which = buckets(key, ids)
    differ = differing(bucket_digests(key, ids, which), digests)
    return bitmap(differ) + id_table(differ, members(ids, which, differ))


def drops(key: bytes, ids: list[bytes], answer: bytes, chunk_ids: int | None = None) -> Drops:
    """Server 0's answer to message 2 over its frozen ids: what it drops, and message 3 in chunks of at
    most `chunk_ids` ids (default CHUNK_IDS), each with its index, a last flag and the keyed hash of
    server 0's set after its drops. A function of `answer` and the set: over the set after these drops
    it gives the same bodies (a close run again sends the same messages)."""
    if len(answer) < BUCKETS // 8:
        raise SyncError("the sync message has the wrong length")
    differ = from_bitmap(answer[:BUCKETS // 8])
    theirs = read_id_table(answer[BUCKETS // 8:], differ)
    grouped = members(ids, buckets(key, ids), differ) if differ.size else {}  # no PRF pass when the sets agree
    drop: set[bytes] = set()
    they_drop: set[bytes] = set()
    for b in differ.tolist():
        drop |= set(grouped[b]) - theirs[b]
        they_drop |= theirs[b] - set(grouped[b])
    final = _raw_hash(key, [i for i in ids if i not in drop] if drop else ids)
    listed, size = sorted(they_drop), chunk_ids or CHUNK_IDS
    starts = range(0, max(len(listed), 1), size)
    bodies = tuple(k.to_bytes(4, "big") + (b"\x01" if start + size >= len(listed) else b"\x00") + final
                   + id_list(listed[start:start + size]) for k, start in enumerate(starts))
    acks = tuple(_ack(body, final if body[4:5] == b"\x01" else _NO_HASH) for body in bodies)  # must end at `final`
    return Drops(frozenset(drop), bodies, acks)


def take_drops(key: bytes, ids: list[bytes], body: bytes) -> Taken:
    """Server 1's move on a chunk of message 3 over its ids: drop the chunk's ids it holds and
    acknowledge (message 4: the chunk's index and digest, and at the last chunk the hash of its set
    after the drops); done only if that hash equals server 0's, so a lost, replayed or reordered chunk
    can never leave the two servers reconciled on different sets."""
    if len(body) < _CHUNK_HEAD:
        raise SyncError("the sync message is truncated")
    listed = read_id_list(body[_CHUNK_HEAD:])
    drop = frozenset(listed) & frozenset(ids) if listed else frozenset()  # no set of every id for an empty chunk
    last = body[4:5] == b"\x01"
    mine = _raw_hash(key, [i for i in ids if i not in drop] if drop else ids) if last else _NO_HASH
    return Taken(drop, _ack(body, mine), last and hmac.compare_digest(mine, body[5:_CHUNK_HEAD]))


def check_ack(payload: bytes, expected: bytes) -> None:
    """Server 1's acknowledgement of a chunk of message 3 must be exactly `expected` (its index and
    digest, and at the last chunk the hash of a set equal to server 0's); anything else is a SyncError."""
    if not hmac.compare_digest(payload[:36], expected[:36]):
        raise SyncError("server 1 acknowledged another chunk")
    if not hmac.compare_digest(payload, expected):
        raise SyncError("server 1's report set differs from server 0's after the drops")


_CHUNK_HEAD = 4 + 1 + 32  # index, last flag, server 0's set hash after its drops
_NO_HASH = bytes(32)  # in the acks of all but the last chunk


def _ack(chunk: bytes, set_digest: bytes) -> bytes:
    """Message 4's payload: the chunk's index and SHA-256, and the acknowledging server's set hash."""
    return chunk[:4] + hashlib.sha256(chunk).digest() + set_digest


def _raw_hash(key: bytes, ids: list[bytes]) -> bytes:
    return bytes.fromhex(set_hash(key, ids))


def _subkey(key: bytes, label: bytes) -> bytes:
    """One key per use of K (PRF, set hash, digests, AEAD): HMAC(K, label)."""
    return hmac.new(key, label, hashlib.sha256).digest()
