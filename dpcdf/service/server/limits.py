"""What one client without a token can hold of a server, bounded (issue 20; per address prefix, issue 42).

Anyone may open a connection and upload reports (clients are unauthenticated). So every connection
is bounded before anything is known about its sender (the numbers are `Limits`' defaults;
docs/service.md has them as a table). The servers' own messages (/sync, /verify) take a path of their
own (issue 42): a request tag in their headers is checked before the body is read (`peer_gate`), and
only then do they take a place, in a pool of their own:

headers     a request's headers (at most `header_bytes`, 32 KiB) must arrive within `header_seconds`
            (5 s) of the connection opening or of the previous answer; else the connection is closed
            (`connections.protocol`, the uvicorn protocol `app.serve` runs);
prefixes    every budget below "per address" counts per address prefix (issue 42): the client
            address's /`prefix_v4` (24) for IPv4 (and IPv4-mapped IPv6), /`prefix_v6` (64) for IPv6
            (`prefix_of`), so an attacker's neighbouring addresses share one budget;
connections at most `connections_per_address` (32) open per address prefix and `connections` (1,024)
            in all for clients; one more is put on probation (`connections.protocol`): its request is
            served only if it carries a key (the other server's request tag, an analyst's or the
            operator's token: `reserve.Reserve`, from its headers and memory), in
            `reserved_connections` (32) places of their own, else it is answered 429 after
            `probation_seconds` (5 s: a held flood does not reconnect) and charged. A connection's
            answer closes it after `keepalive_requests` (100) requests or `keepalive_seconds` (60 s);
bodies      refused by their Content-Length before a byte is read when over the endpoint's limit
            (413; `BODY_LIMITS`); a body without Content-Length (chunked) is cut at `chunked_bytes`
            (64 KiB, 411). A body's bytes count as they arrive: after `body_grace` (2 s) of waiting
            for them it must keep `body_rate` (16 KiB/s) on average (time the server itself does not
            read is not counted), with no pause over `idle_seconds` (5 s), and be whole within
            `body_seconds` (10 s) of its headers, else 408 and the connection is closed. Past
            `memory_bytes` (256 KiB) a body waits in an unlinked 0600 file, not in memory
            (`deps.raw_body`);
uploads     reports and batches: at most `uploads_per_address` (8) and
            `upload_bytes_per_address` (128 MiB of declared bodies) in flight per address prefix,
            `uploads` (64) and `upload_bytes` (1 GiB) in all; more get 429 (Retry-After: 1) after
            `refused_seconds` (1 s), unread;
peers       /sync and /verify: without the other server's request tag 401, with a wrong one (or for
            a task this server does not know) 403, at once and charged to the address as a failure
            (`peer_gate.PeerGate.check`: from the headers, no body read, no store touched, the same
            time whatever the task's n); a /verify for an unverified task 409. Admitted ones take one
            of `peer_requests` (8) places and `peer_bytes` (256 MiB) of declared bodies, a pool client
            uploads never enter (so slow uploads cannot refuse the close's messages); more get 429
            (Retry-After: 1), which server 0 sends again. An admitted peer is not held back or refused
            for its address's failure level, and its connections pass its prefix's caps and refusal
            (the reserve, above);
failures    every report refused at upload (junk, foreign, or a share that does not open with this
            server's key) adds one to its prefix's level (`Failures`), which drains
            `drain_per_second` (0.5) per second. From `slow_level` (8) the prefix's uploads are held
            back before they are read (up to `max_delay`, 1 s); from `refuse_level` (32) they are
            refused (429 with Retry-After) until the level is back at `slow_level`, each refused one
            adding one more, and its new connections are put on probation: without a key held
            `probation_seconds`, answered 429 and closed, each charged (so is a connection over its
            prefix's cap). A batch stops opening shares once its prefix reaches `refuse_level`
            (429; nothing of it is stored). The Guard's own refusals count too (issue 42): a body
            refused on its length (413, 411), one that stopped coming (408), a malformed
            Content-Length (400) and an upload over its prefix's own budget (429; not one refused
            because the pool is full in all, which an honest client cannot help) each add one.

Every refusal from here closes the connection (`Connection: close`), so the unread rest of a body is
never read. A client's address is the TCP peer's: behind a proxy every client shares the proxy's,
and an attacker with addresses in many prefixes needs a firewall in front.
"""
from __future__ import annotations

import asyncio
import functools
import ipaddress
import json
import math
import re
import threading
import time
from dataclasses import dataclass
from typing import TypedDict

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ...errors import DpcdfError
from .peer_gate import PeerGate, PeerRefusal

KIB, MIB = 1 << 10, 1 << 20

# (path pattern, largest body in bytes, kind): "upload" and "peer" are unauthenticated when read
BODY_LIMITS: tuple[tuple[re.Pattern, int, str], ...] = (
    (re.compile(r"/tasks/[^/]+/reports"), 64 * KIB, "upload"),  # one report: a few KiB at most
    (re.compile(r"/tasks/[^/]+/reports/batch"), 64 * MIB, "upload"),  # up to wire.MAX_BATCH reports
    (re.compile(r"/tasks/[^/]+/(sync|verify)"), 64 * MIB, "peer"),  # reconcile's chunks of 2^20 ids are 16 MiB
    (re.compile(r"/tasks"), 64 * MIB, "operator"),  # a task config (thresholds grids); read after the token
    (re.compile(r"/tasks/[^/]+/query"), 1 * MIB, "analyst"),  # 65,536 indices of 7 digits: about 0.5 MiB
)
DEFAULT_BODY = 64 * KIB  # every other request (close, status, health: no body)
MAX_BODY = max(limit for _, limit, _ in BODY_LIMITS)  # the largest body any endpoint takes


@dataclass(frozen=True)
class Limits:
    header_bytes: int = 32 * KIB
    header_seconds: float = 5.0
    connections_per_address: int = 32
    connections: int = 1024
    chunked_bytes: int = 64 * KIB
    idle_seconds: float = 5.0
    body_seconds: float = 10.0
    memory_bytes: int = 256 * KIB
    uploads_per_address: int = 8
    uploads: int = 64
    upload_bytes_per_address: int = 128 * MIB  # declared body bytes in flight (in memory or spooled)
    upload_bytes: int = 1024 * MIB
    slow_level: float = 8.0
    refuse_level: float = 32.0
    drain_per_second: float = 0.5
    max_delay: float = 1.0
    refused_seconds: float = 1.0  # a refused upload waits this long for its 429
    peer_requests: int = 8  # the other server's messages in flight (a close sends one at a time per task)
    peer_bytes: int = 256 * MIB  # their declared bodies (reconciliation's chunks are up to 16 MiB)
    addresses: int = 100_000  # failure levels remembered at most (the oldest drained ones go first)
    prefix_v4: int = 24  # the budgets' unit: an IPv4 address's /24 (a network, not a host)
    prefix_v6: int = 64  # and an IPv6 address's /64
    body_rate: int = 16 * KIB  # bytes a second a body must average, counted as they arrive, after body_grace
    body_grace: float = 2.0  # seconds of waiting a body has before its pace counts (a slow start, one report)
    keepalive_seconds: float = 60.0  # a connection's age after which its next answer closes it
    keepalive_requests: int = 100  # requests per connection: the last one's answer closes it
    reserved_connections: int = 32  # in all, beyond the clients' caps: the other server, analysts, the operator
    probation_per_address: int = 1024  # a prefix's connections over its cap or refused, read for a key (oldest dropped)
    probation: int = 1024  # those in all
    probation_seconds: float = 5.0  # one without a key is held this long, then 429 (a flood held is not reconnecting)


REFUSED = "too many of this address's reports failed to open or were refused; send again in {} s"
CROWDED = ("too many connections from this address prefix (at most {}), or from all (at most {}); send again "
           "in 1 s, on fewer connections")


def body_rule(path: str) -> tuple[int, str]:
    """The largest body a request to `path` may carry, and the endpoint's kind."""
    for pattern, limit, kind in BODY_LIMITS:
        if pattern.fullmatch(path):
            return limit, kind
    return DEFAULT_BODY, "other"


@functools.lru_cache(maxsize=1 << 16)
def _prefix(address: str, v4: int, v6: int) -> str:
    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        return address  # "unknown", a test client's name, or a prefix already
    if ip.version == 6 and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return str(ipaddress.ip_network(f"{ip}/{v4 if ip.version == 4 else v6}", strict=False))


def prefix_of(address: str, limits: Limits) -> str:
    """The budgets' unit for a client address: its network of `limits.prefix_v4` bits (IPv4, and
    IPv4-mapped IPv6) or `prefix_v6` bits (IPv6), as a string ("192.0.2.0/24"); anything that is not
    an IP address (a prefix already, "unknown") is its own."""
    return _prefix(address, limits.prefix_v4, limits.prefix_v6)


class Failures:
    """Per client address prefix (`prefix_of`), a leaky bucket of failures (reports that did not
    open, junk uploads, forged peer messages, the Guard's refusals), with the refusal's hysteresis.
    Every method takes an address (or its prefix). Thread-safe: the middleware reads it on the event
    loop, the upload handlers charge it in the thread pool."""

    def __init__(self, limits: Limits, clock=time.monotonic):
        self.limits, self.clock = limits, clock
        self._state: dict[str, list] = {}  # address prefix -> [level, at, refused]
        self._lock = threading.Lock()

    def _get(self, address: str, now: float) -> list:
        st = self._state.get(prefix_of(address, self.limits))
        if st is None:
            return [0.0, now, False]
        st[0], st[1] = max(0.0, st[0] - (now - st[1]) * self.limits.drain_per_second), now
        if st[2] and st[0] <= self.limits.slow_level:
            st[2] = False
        return st

    def level(self, address: str) -> float:
        with self._lock:
            return self._get(address, self.clock())[0]

    def charge(self, address: str, n: float = 1.0) -> float:
        """Adds `n` failures to the address (at most twice `refuse_level` is kept); its new level."""
        with self._lock:
            now = self.clock()
            st = self._get(address, now)
            if n > 0:
                st[0] = min(st[0] + n, 2 * self.limits.refuse_level)
                st[2] = st[2] or st[0] >= self.limits.refuse_level
                self._state[prefix_of(address, self.limits)] = st
                if len(self._state) > self.limits.addresses:
                    self._forget(now)
            return st[0]

    def _forget(self, now: float) -> None:
        for address in [a for a in self._state if self._get(a, now)[0] == 0]:
            del self._state[address]
        while len(self._state) > self.limits.addresses:  # all still failing: the longest quiet first
            del self._state[min(self._state, key=lambda a: self._state[a][1])]

    def allowance(self, address: str) -> int:
        """How many more failures the address may cause before it is refused (0: refused now)."""
        with self._lock:
            st = self._get(address, self.clock())
            return 0 if st[2] else max(0, math.ceil(self.limits.refuse_level - st[0]))

    def refused_for(self, address: str) -> float:
        """Seconds until the address's uploads are taken again (0: now). Refused from `refuse_level`
        until the level has drained to `slow_level`."""
        with self._lock:
            st = self._get(address, self.clock())
            return (st[0] - self.limits.slow_level) / self.limits.drain_per_second if st[2] else 0.0

    def delay(self, address: str) -> float:
        """Seconds to hold back the address's next upload: 0 up to `slow_level`, rising to `max_delay`
        at `refuse_level`."""
        lim = self.limits
        over = self.level(address) - lim.slow_level
        return 0.0 if over <= 0 else min(lim.max_delay, lim.max_delay * over / (lim.refuse_level - lim.slow_level))


class BodyTimeout(DpcdfError):
    """A body that stopped coming, or did not arrive in time."""


class BodyTooLong(DpcdfError):
    """A chunked body past its cap."""


class _Body(TypedDict):
    """A request body's progress (`Limiter._serve`)."""
    size: int
    done: bool
    failed: BodyTimeout | BodyTooLong | None
    started: bool
    waited: float


def client_address(scope: Scope) -> str:
    client = scope.get("client")
    return str(client[0]) if client else "unknown"


def refusal(status: int, message: str, retry_after: int | None = None) -> tuple[Message, Message]:
    """The two ASGI messages of a JSON refusal that closes the connection."""
    body = json.dumps({"error": message}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
               (b"connection", b"close")]
    if retry_after is not None:
        headers.append((b"retry-after", str(retry_after).encode()))
    return ({"type": "http.response.start", "status": status, "headers": headers},
            {"type": "http.response.body", "body": body, "more_body": False})


class Guard:
    """The ASGI middleware: body limits by Content-Length before reading, body timeouts, the upload
    slots per address and in all, the failure levels' delays and refusals, and the servers' own
    messages checked by `gate` (a `peer_gate.PeerGate`; None refuses them all) in their own pool
    (see the module)."""

    def __init__(self, app: ASGIApp, limits: Limits, failures: Failures, gate: PeerGate | None = None, reserve=None):
        self.app, self.limits, self.failures, self.gate = app, limits, failures, gate
        self.reserve = reserve  # a `reserve.Reserve`: learns the address of each admitted peer message
        self.in_flight: dict[str, list[int]] = {}  # address prefix -> [uploads, declared bytes]
        self.total = [0, 0]
        self.peers = [0, 0]  # the other server's messages in flight, their declared bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        lim = self.limits
        limit, kind = body_rule(scope["path"])
        length = chunked = None
        for name, value in scope["headers"]:
            if name == b"content-length":
                if length is not None or not value.isdigit():
                    self.failures.charge(client_address(scope))
                    return await self._refuse(send, 400, "a request needs one Content-Length of digits")
                length = int(value)
            elif name == b"transfer-encoding":
                chunked = value
        if length is not None and length > limit:
            self.failures.charge(client_address(scope))
            return await self._refuse(send, 413, f"request body over {limit} bytes")
        cap = limit if length is not None else min(limit, lim.chunked_bytes)
        if length is None and chunked is None:
            cap = 0  # no body
        if kind == "peer":
            return await self._peer(scope, receive, send, length, cap)
        if kind != "upload":
            return await self._serve(scope, receive, send, cap)
        address = prefix_of(client_address(scope), lim)  # every budget is its prefix's (issue 42)
        wait = self.failures.refused_for(address)
        if wait > 0:
            self.failures.charge(address)
            return await self._refuse(send, 429, REFUSED.format(math.ceil(wait)), math.ceil(wait))
        mine, size = self.in_flight.get(address, [0, 0]), length if length is not None else cap
        own = mine[0] >= lim.uploads_per_address or mine[1] + size > lim.upload_bytes_per_address
        if own or self.total[0] >= lim.uploads or self.total[1] + size > lim.upload_bytes:
            if own:  # over its prefix's own budget: charged (a full pool in all is not the client's doing)
                self.failures.charge(address)
            await asyncio.sleep(lim.refused_seconds)  # not at once: a client that loops waits too
            return await self._refuse(send, 429, f"too many uploads at once (at most {lim.uploads_per_address} and "
                                      f"{lim.upload_bytes_per_address >> 20} MiB per address prefix, {lim.uploads} and "
                                      f"{lim.upload_bytes >> 20} MiB in all); send again in 1 s", 1)
        self.in_flight[address] = [mine[0] + 1, mine[1] + size]
        self.total = [self.total[0] + 1, self.total[1] + size]
        try:
            delay = self.failures.delay(address)
            if delay:
                await asyncio.sleep(delay)
            await self._serve(scope, receive, send, cap)
        finally:
            self.total = [self.total[0] - 1, self.total[1] - size]
            left = self.in_flight.pop(address)
            if left[0] > 1:
                self.in_flight[address] = [left[0] - 1, left[1] - size]

    async def _peer(self, scope: Scope, receive: Receive, send: Send, length: int | None, cap: int) -> None:
        """A /sync or /verify: the gate's verdict from its headers (a refusal at once, unread, charged
        if forged: see `peer_gate`), then a place in the peers' pool, then the body."""
        gate = self.gate or PeerGate(0, None)  # no gate: every message refused (as on server 0)
        verdict = gate.check(scope["method"], scope["path"], scope["headers"], length)
        if isinstance(verdict, PeerRefusal):
            if verdict.forged:
                self.failures.charge(client_address(scope))
            return await self._refuse(send, verdict.status, verdict.message)
        length = verdict.length  # (the declared one: a gate refuses none)
        lim, pool = self.limits, self.peers
        if pool[0] >= lim.peer_requests or pool[1] + length > lim.peer_bytes:
            return await self._refuse(send, 429, f"too many of the other server's messages at once (at most "
                                      f"{lim.peer_requests} and {lim.peer_bytes >> 20} MiB); send again in 1 s", 1)
        scope["dpcdf.peer"] = verdict  # the head the body must start with (`peers.answer`)
        if self.reserve is not None:
            self.reserve.learn(client_address(scope))  # its next connections skip the clients' caps (`reserve`)
        self.peers = [pool[0] + 1, pool[1] + length]
        try:
            await self._serve(scope, receive, send, cap)
        finally:
            self.peers = [self.peers[0] - 1, self.peers[1] - length]

    async def _serve(self, scope: Scope, receive: Receive, send: Send, cap: int) -> None:
        lim = self.limits
        deadline = time.monotonic() + lim.body_seconds
        state: _Body = {"size": 0, "done": cap == 0, "failed": None, "started": False, "waited": 0.0}

        async def guarded() -> Message:
            if state["done"]:
                return await receive()  # after the body: waits for a disconnect
            if state["failed"] is not None:
                raise state["failed"]
            now = time.monotonic()  # the pace: each byte that came buys 1/body_rate s of waiting for the next
            credit = lim.body_grace + state["size"] / lim.body_rate - state["waited"]
            left = min(lim.idle_seconds, deadline - now, credit)
            try:
                if left <= 0:
                    raise asyncio.TimeoutError
                message = await asyncio.wait_for(receive(), left)
            except asyncio.TimeoutError:
                late = state["failed"] = BodyTimeout(f"the body must come at {lim.body_rate:,} bytes/s or more (counted "
                                                     f"after {lim.body_grace:g} s), with no pause over {lim.idle_seconds:g} s, "
                                                     f"and arrive whole within {lim.body_seconds:g} s")
                raise late from None
            finally:
                state["waited"] += time.monotonic() - now  # only time spent waiting for it counts
            if message["type"] == "http.request":
                state["size"] += len(message.get("body", b""))
                if state["size"] > cap:
                    long = state["failed"] = BodyTooLong(f"a body over {cap} bytes needs a Content-Length header"
                                                         if cap < lim.chunked_bytes + 1 else f"request body over {cap} bytes")
                    raise long
                state["done"] = not message.get("more_body", False)
            else:
                state["done"] = True
            return message

        async def guarded_send(message: Message) -> None:
            if state["failed"] is not None:
                return  # the app's answer to a body it could not read: ours goes instead
            if message["type"] == "http.response.start":
                state["started"] = True
                if not state["done"]:  # answered before its body was read: do not read the rest
                    message = {**message, "headers": [*message.get("headers", []), (b"connection", b"close")]}
            await send(message)

        try:
            await self.app(scope, guarded, guarded_send)
        except Exception:
            if state["failed"] is None:
                raise
        failed = state["failed"]
        if failed is not None:
            self.failures.charge(client_address(scope))  # 408, 411, 413: the body's sender's doing
        if failed is not None and not state["started"]:
            status = 408 if isinstance(failed, BodyTimeout) else 411 if "Content-Length" in str(failed) else 413
            for message in refusal(status, str(failed)):
                await send(message)

    @staticmethod
    async def _refuse(send: Send, status: int, message: str, retry_after: int | None = None) -> None:
        for m in refusal(status, message, retry_after):
            await send(m)
