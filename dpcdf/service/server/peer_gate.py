"""Server-to-server requests on their own authenticated path (issue 42, items 1 and 3).

What it enforces, and where. `/tasks/{id}/sync` and `/tasks/{id}/verify` are server 0's messages to
server 1. Server 1's middleware (`limits.Guard`) hands each such request's path, headers and declared
Content-Length to `PeerGate.check` before a byte of its body is read, and before the request takes a
place in any pool:
- **Only the other server gets past the headers.** The request must carry the `Dpcdf-Peer` header of
  `protocols.channel.request_header`: an HMAC under a subkey of the task's pair key K (which only the
  two servers can compute, from their X25519 keys and the task's fingerprint) over the direction,
  method, canonical path, task id, the message's head (kind, chunk, AES-GCM nonce) and its declared
  length. Without it: 401; with a wrong one, or for a task this server does not know (or on server 0,
  which takes no such message): 403. Each refusal is answered at once, from memory (this table of keys,
  loaded at the start and at each registration), without reading the body or touching the store, in the
  same time whatever the task and its n (an unknown task's tag is computed under a random key and
  compared all the same), and is charged to the sender's address (`Failures`: from the refusal level
  its connections are held and refused). After the body arrives, the router checks that it starts with
  the head the tag covers (`peers.answer`), then the channel opens it under K as before: the tag is a
  gate in front of the channel's authentication, not a replacement for it.
- **Messages that mean nothing in the task's state are refused before any work**: a `/verify` for an
  unverified task gets 409 from this table (in memory), before its body is read.
- **Their own pool**: admitted peer requests are counted against `Limits.peer_requests` and
  `peer_bytes`, not the uploads' pool, so no number of slow client uploads can refuse the close's
  messages (the review stalled a close with 16 slow uploads; `bench/bench_exhaustion.py --phases peer`).
- **No timing channel on n for anyone without a token** (item 3): every refusal above costs the same
  whatever the task's n; what depends on n (opening a check message needs the report set's keyed hash,
  answering a reconciliation message reads the set) happens only after the tag, so only the other
  server, which holds n anyway, can time it. The close's own duration grows with n and is the
  analyst's to see (docs/service.md, Trust model): it takes the analyst's token.

The same table holds, for `reserve.Reserve` (the room kept for keys), the tasks' analyst token hashes
and, on server 1, server 0's IP address where a task's URL names one.

What it does not do: a third party on the wire between the servers (no TLS) can replay a whole
genuine request, which the channel answers with its journalled answer (its size is on the wire anyway),
or replay its header with another body of the same length and head, which gets past this gate and is
refused (400) by the channel; TLS between the servers closes both.
"""
from __future__ import annotations

import hmac
import ipaddress
import json
import re
import secrets
from dataclasses import dataclass
from typing import Iterable
from urllib.parse import urlsplit

from cryptography.hazmat.primitives.asymmetric import x25519

from ..protocols.channel import PEER_HEADER, read_header, request_key, request_tag
from ..protocols.reconciliation.maths import pair_key
from ..task import TaskConfig

PEER_PATH = re.compile(r"/tasks/([^/]+)/(sync|verify)")
NO_TAG = ("a server-to-server message needs the other server's request tag (the Dpcdf-Peer header), "
          "and a Content-Length")
BAD_TAG = "the request tag is not the other server's for this task"
UNVERIFIED = "task {} is not verified: it has no report check, and takes no /verify message"
_HEADER = PEER_HEADER.encode()


@dataclass(frozen=True)
class PeerRequest:
    """An admitted server-to-server request: its body must start with `head` (checked once read)."""
    task_id: str
    endpoint: str
    head: bytes
    length: int


@dataclass(frozen=True)
class PeerRefusal:
    """A refused one: its status and message, and whether it is charged to the sender's address."""
    status: int
    message: str
    forged: bool


class PeerGate:
    """Server `party`'s table of its tasks' request-tag keys and whether each is verified."""

    def __init__(self, party: int, own: x25519.X25519PrivateKey | None):  # None: server 0's (it refuses every message)
        self.party, self._own = party, own
        self._tasks: dict[str, tuple[bytes, bool]] = {}  # task id -> (request_key(K), verify)
        self._decoy = secrets.token_bytes(32)  # an unknown task's tag is checked under it: the same time
        self.analysts: set[str] = set()  # the tasks' analyst token hashes (`reserve.Reserve` reads them)
        self.peer_addresses: set[str] = set()  # the other server's IP where a task's URL names one

    @classmethod
    def load(cls, party: int, own: x25519.X25519PrivateKey, rows: Iterable[tuple[str, str, bytes]]) -> "PeerGate":
        """The gate with the store's tasks (task id, config JSON, fingerprint), read once at the start."""
        gate = cls(party, own)
        for task_id, text, fingerprint in rows:
            try:
                d = json.loads(text)
                gate._add(task_id, d["hpke_keys"][1 - party], bytes(fingerprint), bool(d.get("verify", False)),
                          str(d["token_hash"]), str(d["servers"][1 - party]))
            except (ValueError, KeyError, TypeError, IndexError):
                continue  # not a config this server could serve: its messages get 403, as an unknown task's
        return gate

    def add(self, config: TaskConfig) -> None:
        """A task just registered."""
        self._add(config.task_id, config.hpke_keys[1 - self.party], config.fingerprint, bool(config.verify),  # (a bool by now)
                  config.token_hash, config.servers[1 - self.party])

    def _add(self, task_id: str, peer_hex: str, fingerprint: bytes, verify: bool, analyst: str, peer_url: str) -> None:
        self.analysts.add(analyst)
        if self.party == 1:  # server 0 takes no server-to-server message: every one is refused 403
            assert self._own is not None  # (server 1's gate has its key)
            k = pair_key(self._own, bytes.fromhex(peer_hex)[-32:], fingerprint)
            self._tasks[task_id] = (request_key(k), verify)
            try:
                self.peer_addresses.add(str(ipaddress.ip_address(urlsplit(peer_url).hostname or "")))
            except ValueError:
                pass  # a host name: its address is learned from its first tagged message (`reserve.Reserve.learn`)

    def check(self, method: str, path: str, headers: Iterable[tuple[bytes, bytes]], length: int | None) -> PeerRequest | PeerRefusal:
        """The verdict on a request to `path` (/tasks/{id}/sync or /verify) from its method, headers and
        declared Content-Length alone (see the module): no body is read and no store touched."""
        match = PEER_PATH.fullmatch(path)
        values = [value for name, value in headers if name == _HEADER]
        parsed = read_header(values[0]) if len(values) == 1 else None
        if match is None or parsed is None or length is None:
            return PeerRefusal(401, NO_TAG, True)
        task_id, endpoint = match.groups()
        head, tag = parsed
        entry = self._tasks.get(task_id)
        key, verify = entry if entry is not None else (self._decoy, False)
        if not hmac.compare_digest(request_tag(key, endpoint, task_id, head, length, method), tag) or entry is None:
            return PeerRefusal(403, BAD_TAG, True)
        if endpoint == "verify" and not verify:
            return PeerRefusal(409, UNVERIFIED.format(task_id), False)
        return PeerRequest(task_id, endpoint, head, length)
