"""The connections' limits (issue 20; per address prefix and with room reserved for keys since issue 42):
the uvicorn protocol that `app.serve` runs, which bounds a request's headers in size and time, caps the
connections open per address prefix and in all, caps a keep-alive connection's age and requests, and
puts a connection that the caps (or its prefix's refusal, `limits.Failures`) would refuse on probation
instead of closing it unread: its request is served only if it carries a key (`reserve.Reserve`: the
other server's request tag, an analyst's or the operator's token), else it gets 429 once
`probation_seconds` have passed, and the connection is charged to its prefix. What a request may hold
once its headers are in is `limits.Guard`'s."""
from __future__ import annotations

import math
import time
import urllib.parse

from .limits import CROWDED, REFUSED, Failures, Limits, prefix_of, refusal
from .reserve import Reserve


class Table:
    """Who holds the connections: clients per prefix and in all, the connections on probation per prefix
    and in all, and the reserved ones. Used on the event loop only. Probation is kept in two queues,
    oldest first, per prefix and in all: connections already refused (waiting for their 429) and those
    still waiting for their headers, so that pushing one out costs O(1) however many are held."""

    def __init__(self, limits: Limits):
        self.limits = limits
        self.open: dict[str, int] = {}  # prefix -> client connections
        self.clients = 0
        self.probation: dict[str, tuple[dict, dict]] = {}  # prefix -> (refused, waiting): {connection: None}
        self.everyone: tuple[dict, dict] = ({}, {})
        self.reserved = 0

    def admit(self, conn) -> None:
        """Puts `conn` on probation, pushing out the prefix's (or, over the total, anyone's) oldest
        connection on probation, one already refused first."""
        mine = self.probation.setdefault(conn.prefix, ({}, {}))
        mine[1][conn] = self.everyone[1][conn] = None
        if len(mine[0]) + len(mine[1]) > self.limits.probation_per_address:
            self._evict(mine)
        if len(self.everyone[0]) + len(self.everyone[1]) > self.limits.probation:
            self._evict(self.everyone)

    def refused(self, conn) -> None:
        """`conn`'s request carries no key: first in line to be pushed out."""
        mine = self.probation.get(conn.prefix)
        if mine is not None and mine[1].pop(conn, 0) is None:
            mine[0][conn] = None
            del self.everyone[1][conn]
            self.everyone[0][conn] = None

    def _evict(self, queues: tuple[dict, dict]) -> None:
        victim = next(iter(queues[0] or queues[1]))
        self.leave(victim)
        victim.evict()

    def leave(self, conn) -> None:
        mine = self.probation.get(conn.prefix)
        if mine is None:
            return
        for queue in (*mine, *self.everyone):
            queue.pop(conn, None)
        if not mine[0] and not mine[1]:
            del self.probation[conn.prefix]


def protocol(limits: Limits, failures: Failures, reserve: Reserve | None = None):
    """The uvicorn HTTP protocol class with the connection limits (httptools' protocol, which
    uvicorn[standard] runs by default). `reserve` None: no request has a key (probation refuses all)."""
    import httptools
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    table = Table(limits)
    keys = reserve or Reserve(None, "")

    class GuardedHttpTools(HttpToolsProtocol):
        """Headers must arrive whole (at most `header_bytes`) within `header_seconds` of the
        connection or of the previous answer; at most `connections_per_address` client connections per
        address prefix (`limits.prefix_of`) and `connections` in all; a connection's last answer closes
        it after `keepalive_requests` requests or `keepalive_seconds` (see the module for the rest)."""

        _timer = None
        prefix = ""  # its address's prefix (`prefix_of`), set when it connects, before any use
        kind: str | None = None  # "client", "probation", "reserved" or None (not counted)
        refused = False  # on probation, its request without a key is refused
        _charge = False  # its prefix is charged when it closes without a request with a key
        _keyed = False
        _waiting = True  # for a request's headers
        _header_bytes = 0

        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            self._born, self._requests = time.monotonic(), 0
            address = self.client[0] if self.client else "unknown"
            self.prefix = prefix_of(address, limits)  # counted per prefix
            if len(self.connections) > limits.connections + limits.reserved_connections + limits.probation:
                transport.close()  # (uncounted)
                return
            wait = failures.refused_for(self.prefix)
            crowded = table.open.get(self.prefix, 0) >= limits.connections_per_address
            if wait <= 0 and not crowded and table.clients < limits.connections:
                self.kind = "client"
                table.open[self.prefix] = table.open.get(self.prefix, 0) + 1
                table.clients += 1
                return self._arm(limits.header_seconds)
            self._charge = wait > 0 or crowded  # the prefix's own doing (not all clients' crowding)
            self._retry = max(1, math.ceil(wait))
            self._message = REFUSED.format(self._retry) if wait > 0 else CROWDED.format(limits.connections_per_address,
                                                                                      limits.connections)
            self._refuse_at = self._born + limits.probation_seconds
            if keys.vouched(address) and table.reserved < limits.reserved_connections:
                self.kind = "reserved"
                table.reserved += 1
            else:
                self.kind = "probation"
                table.admit(self)
            self._arm(limits.probation_seconds)

        def evict(self) -> None:
            """Pushed out of probation by a newer connection (`Table.admit`)."""
            self.kind = None
            self._disarm()
            if self._charge and not self._keyed:
                failures.charge(self.prefix)
                self._charge = False
            if not self.transport.is_closing():
                self.transport.close()

        def connection_lost(self, exc) -> None:
            if self.kind == "client":
                left = table.open.pop(self.prefix) - 1
                if left:
                    table.open[self.prefix] = left
                table.clients -= 1
            elif self.kind == "probation":
                table.leave(self)
            elif self.kind == "reserved":
                table.reserved -= 1
            self.kind = None
            if self._charge and not self._keyed:  # refused, or never sent a request with a key
                failures.charge(self.prefix)
                self._charge = False
            self._disarm()
            super().connection_lost(exc)

        def _arm(self, seconds: float) -> None:
            self._disarm()
            self._waiting, self._header_bytes = True, 0
            self._timer = self.loop.call_later(seconds, self._too_slow)

        def _disarm(self) -> None:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None

        def _too_slow(self) -> None:
            self._timer = None
            if not self._waiting or self.transport.is_closing():
                return
            if self.kind in ("probation", "reserved") and not self._keyed:  # as a refused connection: 429
                return self._refuse()
            self.transport.close()

        def _refuse(self) -> None:
            """429 (Retry-After) and close, written here: a refused request never reaches the app."""
            self._timer = None
            if not self.transport.is_closing():
                start, body = refusal(429, self._message, self._retry)
                head = [b"HTTP/1.1 429 Too Many Requests"] + [name + b": " + value for name, value in start["headers"]]
                self.transport.write(b"\r\n".join(head) + b"\r\n\r\n" + body["body"])
                self.transport.close()

        def data_received(self, data: bytes) -> None:
            if self.refused:  # its answer is on its way: nothing more is read
                return
            super().data_received(data)
            if self._waiting:
                self._header_bytes += len(data)
                if self._header_bytes > limits.header_bytes and not self.transport.is_closing():
                    self.send_400_response(f"request headers over {limits.header_bytes} bytes")

        def on_headers_complete(self) -> None:
            self._waiting = False
            self._disarm()
            self._requests += 1
            if self.kind in ("probation", "reserved") and not self._admit():
                self.refused = True  # answered 429 at `_refuse_at`, unread, without the app (cheap: floods)
                table.refused(self)
                self.transport.pause_reading()
                if self.cycle is not None and not self.cycle.response_complete:
                    self.transport.close()  # (a request pipelined behind one being answered)
                else:
                    self._timer = self.loop.call_later(max(0.0, self._refuse_at - time.monotonic()), self._refuse)
                return
            super().on_headers_complete()
            if self.cycle is not None and (self._requests >= limits.keepalive_requests
                                           or time.monotonic() - self._born >= limits.keepalive_seconds):
                self.cycle.keep_alive = False  # its answer closes the connection ("connection: close")

        def on_body(self, body: bytes) -> None:
            if not self.refused:
                super().on_body(body)

        def on_message_complete(self) -> None:
            if not self.refused:
                super().on_message_complete()

        def _admit(self) -> bool:
            """Whether a request on a connection over the clients' caps carries a key (it then takes a
            place in the reserved room, if one is free)."""
            path = httptools.parse_url(self.url).path.decode("ascii", "replace")
            key = keys.verdict(self.parser.get_method().decode("ascii", "replace"), urllib.parse.unquote(path),
                               self.headers)
            if key is not None and self.kind == "probation" and table.reserved < limits.reserved_connections:
                table.leave(self)
                self.kind = "reserved"
                table.reserved += 1
            self._keyed = self._keyed or (key is not None and self.kind == "reserved")
            return key is not None and self.kind == "reserved"

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self.transport.is_closing() and (self.cycle is None or self.cycle.response_complete):
                self._arm(limits.header_seconds)  # (not while a pipelined request runs)

    return GuardedHttpTools


def uvicorn_options(app) -> dict:
    """uvicorn's settings for the limits of `app` (made by `create_app`)."""
    limits, failures = app.state.limits, app.state.failures
    return {"http": protocol(limits, failures, getattr(app.state, "reserve", None)),
            "timeout_keep_alive": limits.header_seconds, "h11_max_incomplete_event_size": limits.header_bytes}
