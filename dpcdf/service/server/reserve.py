"""Room kept for those who hold a key (issue 42, item 2): the other server, the tasks' analysts and the
operator, so that a flood from clients without a token cannot starve the close and the queries.

Every client budget counts per address prefix (`limits.prefix_of`), and the other server or an analyst
may share a prefix with an attacker. So a connection that the clients' caps would refuse (its prefix is
at `Limits.connections_per_address`, the clients hold `connections` in all, or its prefix is refused
for its failures) is not closed unread: it is put on probation (`connections.protocol`). Its headers
are read (at most `header_bytes`, within `probation_seconds`), and `Reserve.verdict` tells from the
request line and headers alone, against what is in memory, whether they carry a key:
- **the other server**: a `Dpcdf-Peer` request tag that `peer_gate.PeerGate.check` admits (or a
  correctly tagged /verify it refuses as meaningless: 409, from memory);
- **the operator**: a bearer token whose SHA-256 is this server's operator token's;
- **an analyst**: a bearer token whose SHA-256 is a known task's analyst token hash (any task's: the
  router checks it is this task's).
No store is read and nothing but one SHA-256 (a bearer token) or one HMAC (a request tag) is computed.
A request with a key takes one of `Limits.reserved_connections` (32) places, beyond the clients' caps
and exempt from the prefix's refusal; its connection stays there while every request on it carries a
key. A request without one is answered 429 (Retry-After) once `probation_seconds` (5 s) have passed
since its connection opened, unread and without the app, and the connection is charged to its prefix
(held, a flood's connections do not come back at once). Probation holds at most
`probation_per_address` and `probation` (1,024 each) connections, per prefix and in all: a newer one
pushes out the oldest (one already refused first), so no number of idle or slow connections keeps a
key's request out; only a burst of more than that many connections between its arrival and its
headers could, and addresses vouched for skip probation:
- **vouched addresses**: the other server's IP where a task's URL names it as one (server 1 only), and
  any address a correctly tagged message came from (`learn`, the last 16): their connections go
  straight to the reserved places (each request on them must still carry a key).

Honest clients without a token get nothing from here: a prefix shared with an attacker shares its budget.
"""
from __future__ import annotations

import hmac
import ipaddress
from typing import Iterable

from ..task import token_hash
from .peer_gate import PEER_PATH, PeerGate, PeerRequest

LEARNED = 16  # addresses of tagged messages remembered
_AUTH, _LENGTH = b"authorization", b"content-length"


def _normal(address: str) -> str:
    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        return address
    return str(ip.ipv4_mapped or ip) if ip.version == 6 else str(ip)


class Reserve:
    """Whose requests take the reserved room: see the module. `gate` holds the tasks' request-tag keys,
    their analysts' token hashes and the other server's addresses; `operator_hash` is the operator
    token's SHA-256 (hex)."""

    def __init__(self, gate: PeerGate | None, operator_hash: str):
        self.gate, self.operator_hash = gate, operator_hash
        self._learned: dict[str, None] = {}  # oldest first

    def verdict(self, method: str, path: str, headers: Iterable[tuple[bytes, bytes]]) -> str | None:
        """"peer", "operator" or "analyst" if the request carries that key, else None (see the module)."""
        headers = list(headers)
        if PEER_PATH.fullmatch(path):
            if self.gate is None:
                return None
            lengths = [value for name, value in headers if name == _LENGTH]
            length = int(lengths[0]) if len(lengths) == 1 and lengths[0].isdigit() else None
            answer = self.gate.check(method, path, headers, length)
            return "peer" if isinstance(answer, PeerRequest) or not answer.forged else None
        values = [value for name, value in headers if name == _AUTH]
        if len(values) != 1 or values[0][:7].lower() != b"bearer ":
            return None
        try:
            hashed = token_hash(values[0][7:].strip().decode("ascii"))
        except UnicodeDecodeError:
            return None
        if hmac.compare_digest(hashed, self.operator_hash):
            return "operator"
        return "analyst" if self.gate is not None and hashed in self.gate.analysts else None

    def vouched(self, address: str) -> bool:
        """Whether `address` is the other server's, as far as this server knows (see the module)."""
        address = _normal(address)
        return address in self._learned or (self.gate is not None and address in self.gate.peer_addresses)

    def learn(self, address: str) -> None:
        """A correctly tagged message came from `address`."""
        address = _normal(address)
        self._learned.pop(address, None)
        self._learned[address] = None
        while len(self._learned) > LEARNED:
            del self._learned[next(iter(self._learned))]
