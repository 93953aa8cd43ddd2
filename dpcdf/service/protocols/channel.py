"""The one channel every server-to-server message goes through: the servers' shared key, the task's
fingerprint, named message kinds, and the one-shot rule.

Wire format of a message: kind (1 byte) || chunk (u32, big-endian) || nonce (12) || AES-GCM(payload),
under a subkey of the pair key K (`reconciliation.maths.pair_key`), with associated data
"dpcdf channel v2" || kind || chunk || fingerprint || context, where the context is the report set's
keyed hash H_R for the report check's messages (both servers hold R by then) and empty for the
reconciliation's. A message opens only for its task, its kind, its chunk and, in the check, its R.

The one-shot rule (what a deviating server faces; docs/verification.md § A deviating server):
- Helper (server 1): every step (kind, chunk) of a task is answered at most once. The request's
  payload and the answer are journalled (SQLite, `Store.record_exchange`) before the answer leaves;
  the same request again (a retry) gets the journalled answer, other content for that step is refused
  (`Refused`, HTTP 409) and changes nothing. Once the task is finished (server 0's DONE, or a query
  answered), every message is refused, replays too.
- Leader (server 0): the first valid answer to each step is journalled before anything is computed
  from it; a retried close uses the journalled answer and never asks again, so server 0 computes each
  of its replies (its check values V_0) on one input only.
Each step's answer is thus a function of one request: no server can ask the other the same question
about a report twice with different inputs (the two-message attack of issue 20).
- A restored backup (security review of issue 24): the journal is the store's, so a server serving a
  backup has forgotten the steps it took since. Both roles refuse every step (`storage.restore.Restored`,
  HTTP 409) of a task that was not finished in the backup: the journal it would check is not the whole.

The request tag (issue 42): every message server 0 POSTs to server 1 also carries, in the `Dpcdf-Peer`
header, "v1 <head> <tag>": the message's first HEAD_BYTES bytes (its kind, chunk and AES-GCM nonce) in
hex and an HMAC-SHA256 under a subkey of K over the direction (server 0 to 1), method, canonical path
(/tasks/{id}/sync or /verify, whatever URL prefix a proxy adds), task id, that head and the declared
Content-Length (`request_tag`). Server 1 checks it from the headers alone, before reading the body or
touching its store (`dpcdf.service.server.peer_gate`), and later that the body starts with that head:
a header seen on the wire fits only a body with its message's random nonce. It is a gate in front of
the channel, not instead of it: the body is opened under the AES-GCM key as before.
"""
from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass
from enum import IntEnum
from typing import Callable

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from ..storage.lifecycle import DONE_KIND
from ..storage.records import Mark
from ..storage.restore import refuse_steps
from ..storage.store import Store
from .reconciliation.maths import SyncError

_NONCE = 12
_HEAD = 1 + 4
HEAD_BYTES = _HEAD + _NONCE  # what the request tag binds of the body: kind, chunk, nonce
LABEL = b"dpcdf channel v2"
PEER_HEADER = "dpcdf-peer"  # the request tag's header (HTTP header names are case-insensitive)
ENDPOINTS = ("sync", "verify")  # server 1's POST /tasks/{id}/<endpoint>


class Kind(IntEnum):
    """The message kinds, in protocol order (the numbers of docs/service.md and docs/verification.md)."""
    DIGESTS = 1         # reconciliation, server 0 -> 1: bucket digests of its report ids
    DIFFERENCES = 2     # the answer: the differing buckets and server 1's ids in them
    DROPS = 3           # server 0 -> 1, chunked: ids server 1 drops, with server 0's final set hash
    DROPS_ACK = 4       # the answer: the chunk's digest and server 1's set hash
    CHECK_OPEN = 5      # report check, server 0 -> 1, chunked: its round-one messages (e_0, top_0)
    CHECK_ANSWER = 6    # the answer: server 1's round-one messages and a commitment to its MAC values
    CHECK_MAC = 7       # server 0 -> 1: its MAC values sigma_0
    CHECK_MAC_OPEN = 8  # the answer: the commitment's opening (sigma_1) and V_1 where the MACs hold
    CHECK_VALUES = 9    # server 0 -> 1: its V_0 where the MACs hold
    CHECK_ACK = 10      # the answer: the chunk's digest
    CHECK_FINISH = 11   # server 0 -> 1: its set hash after the exclusions
    CHECK_FINAL = 12    # the answer: server 1's
    DONE = DONE_KIND    # 13, server 0 -> 1: the close is over; server 1 answers no further message
    DONE_ACK = 14


ANSWER = {Kind.DIGESTS: Kind.DIFFERENCES, Kind.DROPS: Kind.DROPS_ACK, Kind.CHECK_OPEN: Kind.CHECK_ANSWER,
          Kind.CHECK_MAC: Kind.CHECK_MAC_OPEN, Kind.CHECK_VALUES: Kind.CHECK_ACK, Kind.CHECK_FINISH: Kind.CHECK_FINAL,
          Kind.DONE: Kind.DONE_ACK}
RECONCILIATION = (Kind.DIGESTS, Kind.DROPS)
CHECK = (Kind.CHECK_OPEN, Kind.CHECK_MAC, Kind.CHECK_VALUES, Kind.CHECK_FINISH)
_BOUND = frozenset(k for k in Kind if Kind.CHECK_OPEN <= k <= Kind.CHECK_FINAL)  # carry H_R in their AAD
# steps of one message (chunk 0 only): another chunk number would be a new step, answered afresh
SINGLE = frozenset((Kind.DIGESTS, Kind.DIFFERENCES, Kind.CHECK_FINISH, Kind.CHECK_FINAL, Kind.DONE, Kind.DONE_ACK))


class Refused(SyncError):
    """A message this server will not answer (HTTP 409): a step already answered for other content,
    a step out of phase, or any message once the task's exchange is finished."""


class Unopened(SyncError):
    """A message that does not open under the servers' key for this task, kind, chunk and report set
    (HTTP 400, one answer whatever the reason: no probing)."""


class NotReady(SyncError):
    """Server 1 is still evaluating its reports for the check (HTTP 503: send it again shortly)."""


def request_key(key: bytes) -> bytes:
    """The request tag's key: a subkey of the pair key K, used for nothing else."""
    return hmac.new(key, b"peer request tag v1", hashlib.sha256).digest()


def request_tag(key: bytes, endpoint: str, task_id: str, head: bytes, length: int, method: str = "POST") -> bytes:
    """HMAC-SHA256 under `request_key(K)` of server 0's request (`method`: server 0 only POSTs) of a
    message of `length` bytes that starts with `head` to /tasks/{task_id}/{endpoint}; every field
    length-prefixed."""
    fields = [b"server 0 to server 1", method.encode(), f"/tasks/{task_id}/{endpoint}".encode(), task_id.encode(), bytes(head),
              str(int(length)).encode()]
    return hmac.new(key, b"".join(len(f).to_bytes(4, "big") + f for f in fields), hashlib.sha256).digest()


def request_header(key: bytes, endpoint: str, task_id: str, message: bytes) -> str:
    """The `Dpcdf-Peer` header's value for `message` (sealed) sent to `endpoint`; `key` is `request_key(K)`."""
    head = bytes(message[:HEAD_BYTES])
    return f"v1 {head.hex()} {request_tag(key, endpoint, task_id, head, len(message)).hex()}"


def read_header(value: bytes) -> tuple[bytes, bytes] | None:
    """(head, tag) of a `Dpcdf-Peer` header's value, or None if it is not one."""
    parts = value.split(b" ")
    if len(parts) != 3 or parts[0] != b"v1" or len(parts[1]) > 2 * HEAD_BYTES or len(parts[2]) != 64:
        return None
    try:
        return bytes.fromhex(parts[1].decode("ascii")), bytes.fromhex(parts[2].decode("ascii"))
    except (UnicodeDecodeError, ValueError):
        return None


@dataclass(frozen=True)
class Message:
    kind: Kind
    chunk: int
    payload: bytes


class Channel:
    """Task `task_id`'s messages between the two servers, under the pair key `key`, journalled in
    `store` as `role` ('leader' on server 0, 'helper' on server 1)."""

    def __init__(self, key: bytes, fingerprint: bytes, task_id: str, store: Store, role: str):
        if role not in ("leader", "helper"):
            raise ValueError(f"a channel's role is 'leader' or 'helper', not {role!r}")
        self.fingerprint, self.task_id, self.store, self.role = bytes(fingerprint), task_id, store, role
        self._aead = AESGCM(hmac.new(key, b"channel aead v2", hashlib.sha256).digest())
        self._request_key = request_key(key)

    def request_header(self, endpoint: str, message: bytes) -> str:
        """The `Dpcdf-Peer` header server 0 sends with `message` to server 1's `endpoint` (sync or verify)."""
        return request_header(self._request_key, endpoint, self.task_id, message)

    # --- the wire ---------------------------------------------------------------------------------
    def _aad(self, head: bytes, context: bytes) -> bytes:
        fp = self.fingerprint
        return LABEL + head + len(fp).to_bytes(2, "big") + fp + context

    def seal(self, kind: Kind, chunk: int, payload: bytes, context: bytes = b"") -> bytes:
        head = bytes([kind]) + int(chunk).to_bytes(4, "big")
        nonce = secrets.token_bytes(_NONCE)
        return head + nonce + self._aead.encrypt(nonce, bytes(payload), self._aad(head, self._context(kind, context)))

    def open(self, raw: object, expected: tuple[Kind, ...], context: bytes = b"") -> Message:
        """The message if it is one of the `expected` kinds of this task (and R, for the check's);
        SyncError otherwise (forged, another task's, kind or report set's, truncated)."""
        data = bytes(raw) if isinstance(raw, (bytes, bytearray, memoryview)) else None
        if data is None or len(data) < _HEAD + _NONCE + 16:
            raise SyncError("the message must be the bytes the other server sent")
        kind = data[0]
        if kind not in {int(k) for k in expected}:
            raise SyncError(f"this server takes messages of kind {', '.join(str(int(k)) for k in expected)} here, not {kind}")
        kind, head = Kind(kind), data[:_HEAD]
        if kind in SINGLE and head[1:] != bytes(4):
            raise SyncError(f"message {int(kind)} has one chunk, 0")
        try:
            payload = self._aead.decrypt(data[_HEAD:_HEAD + _NONCE], data[_HEAD + _NONCE:],
                                         self._aad(head, self._context(kind, context)))
        except InvalidTag:
            raise SyncError("the message is not the other server's for this task and step") from None
        return Message(kind, int.from_bytes(head[1:], "big"), payload)

    @staticmethod
    def _context(kind: Kind, context: bytes) -> bytes:
        return bytes(context) if kind in _BOUND else b""

    # --- server 1: answer each step once ----------------------------------------------------------
    def finished(self) -> bool:
        """Whether the task's exchange is over on this server: server 0 said DONE, or a query was
        answered (the release is out: no protocol message may change what it rests on)."""
        return (self.store.exchange(self.task_id, "helper", Kind.DONE, 0) is not None
                or self.store.marked(self.task_id, Mark.ANSWERED))

    def answer_once(self, message: Message, compute: Callable[[bytes], bytes], context: bytes = b"",
                    new_steps: bool = True) -> bytes:
        """The sealed answer to `message`: the journalled one if this step was answered for the same
        payload, else `compute(payload)` journalled first. `Refused` for other content at an answered
        step, for a new step when `new_steps` is False (the protocol is past it), and for anything
        once `finished`; `Restored` for any step of a task restored unfinished from a backup (its journal
        may lack steps answered since: the restored server must not answer one again for other content)."""
        refuse_steps(self.store.lifecycle(self.task_id))
        if self.finished():
            raise Refused("this task's exchange between the servers is finished: no further message is answered")
        kind, chunk = message.kind, message.chunk
        done = self.store.exchange(self.task_id, "helper", kind, chunk)
        if done is None:
            if not new_steps:
                raise Refused(f"step {int(kind)}/{chunk} comes too late: this server is past it")
            done = self.store.record_exchange(self.task_id, "helper", kind, chunk, message.payload, compute(message.payload))
        if not hmac.compare_digest(done.request, message.payload):
            raise Refused(f"step {int(kind)}/{chunk} was answered for another message; it is answered once")
        return self.seal(ANSWER[kind], chunk, done.answer, context)

    def request(self, kind: Kind, chunk: int) -> bytes | None:
        """The request this server took at a step it answered (None if not answered)."""
        row = self.store.exchange(self.task_id, "helper", kind, chunk)
        return None if row is None else row.request

    def answered(self, kind: Kind, chunk: int) -> bytes | None:
        """The answer this server gave at a step (None if not answered)."""
        row = self.store.exchange(self.task_id, "helper", kind, chunk)
        return None if row is None else row.answer

    # --- server 0: ask each step once -------------------------------------------------------------
    def exchange(self, kind: Kind, chunk: int, payload: bytes | Callable[[], bytes], send: Callable[[bytes], bytes],
                 check: Callable[[bytes], None] = lambda answer: None, context: bytes = b"", same: bool = True) -> bytes:
        """The other server's answer payload to this server's step (kind, chunk): the journalled one,
        if any (then nothing is sent; `same`: the payload must equal what was sent, else SyncError);
        else `payload` is sent through `send` and the answer, once it opens as this step's and passes
        `check` (which raises SyncError), is journalled before it is returned. `Restored` for a task
        restored unfinished from a backup: an answer used since may be missing from its journal, and asking
        again would let a deviating server 1 answer differently (its V_0 computed on two inputs)."""
        refuse_steps(self.store.lifecycle(self.task_id))
        done = self.store.exchange(self.task_id, "leader", kind, chunk)
        if done is not None:
            if same and not hmac.compare_digest(done.request, payload() if callable(payload) else payload):
                raise SyncError(f"this server's message at step {int(kind)}/{chunk} changed since it was sent")
            return done.answer
        body = payload() if callable(payload) else payload
        answer = self.open(send(self.seal(kind, chunk, body, context)), (ANSWER[kind],), context)
        if answer.chunk != chunk:
            raise SyncError(f"the other server answered step {int(kind)}/{answer.chunk}, not {int(kind)}/{chunk}")
        check(answer.payload)
        return self.store.record_exchange(self.task_id, "leader", kind, chunk, body, answer.payload).answer
