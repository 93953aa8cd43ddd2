"""The connections' limits (issue 20; per address prefix since issue 42): the uvicorn protocol that
`app.serve` runs, which bounds a request's headers in size and time, caps the connections open per
address prefix and in all, and holds the connections of a refused prefix unread (`limits.Failures`),
and uvicorn's settings for them. What a request may hold once its headers are in is `limits.Guard`'s."""
from __future__ import annotations

import math

from .limits import REFUSED, Failures, Limits, prefix_of, refusal


def protocol(limits: Limits, failures: Failures):
    """The uvicorn HTTP protocol class with the header and connection limits (httptools' protocol,
    which uvicorn[standard] runs by default). A connection from an address prefix that is refused
    (`Failures.refused_for`) is not read: after `refused_seconds` it gets 429 and is closed."""
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    open_per_address: dict[str, int] = {}

    class GuardedHttpTools(HttpToolsProtocol):
        """Headers must arrive whole (at most `header_bytes`) within `header_seconds` of the
        connection or of the previous answer; at most `connections_per_address` connections per
        address prefix (`limits.prefix_of`) and `connections` in all."""

        _timer = None
        _address: str | None = None
        _waiting = True  # for a request's headers
        _header_bytes = 0
        _tarpit = False

        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            self._address = prefix_of(self.client[0] if self.client else "unknown", limits)  # counted per prefix
            open_per_address[self._address] = open_per_address.get(self._address, 0) + 1
            if (open_per_address[self._address] > limits.connections_per_address
                    or len(self.connections) > limits.connections):
                transport.close()
                return
            wait = failures.refused_for(self._address)
            if wait > 0:  # a tarpit: nothing read, one slot of the address's connections held
                failures.charge(self._address)
                self._tarpit = True
                transport.pause_reading()  # (uvloop starts reading after this returns: see data_received)
                self._timer = self.loop.call_later(limits.refused_seconds, self._refuse, math.ceil(wait))
                return
            self._arm()

        def _refuse(self, wait: int) -> None:
            self._timer = None
            if not self.transport.is_closing():
                start, body = refusal(429, REFUSED.format(wait), wait)
                head = [b"HTTP/1.1 429 Too Many Requests"] + [name + b": " + value for name, value in start["headers"]]
                self.transport.write(b"\r\n".join(head) + b"\r\n\r\n" + body["body"])
                self.transport.close()

        def connection_lost(self, exc) -> None:
            if self._address is not None:
                left = open_per_address.pop(self._address) - 1
                if left:
                    open_per_address[self._address] = left
                self._address = None
            self._disarm()
            super().connection_lost(exc)

        def _arm(self) -> None:
            self._disarm()
            self._waiting, self._header_bytes = True, 0
            self._timer = self.loop.call_later(limits.header_seconds, self._too_slow)

        def _disarm(self) -> None:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None

        def _too_slow(self) -> None:
            self._timer = None
            if self._waiting and not self.transport.is_closing():
                self.transport.close()

        def data_received(self, data: bytes) -> None:
            if self._tarpit:
                self.transport.pause_reading()
                return
            super().data_received(data)
            if self._waiting:
                self._header_bytes += len(data)
                if self._header_bytes > limits.header_bytes and not self.transport.is_closing():
                    self.send_400_response(f"request headers over {limits.header_bytes} bytes")

        def on_headers_complete(self) -> None:
            self._waiting = False
            self._disarm()
            super().on_headers_complete()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self.transport.is_closing() and (self.cycle is None or self.cycle.response_complete):
                self._arm()  # (not while a pipelined request runs)

    return GuardedHttpTools


def uvicorn_options(app) -> dict:
    """uvicorn's settings for the limits of `app` (made by `create_app`)."""
    limits, failures = app.state.limits, app.state.failures
    return {"http": protocol(limits, failures), "timeout_keep_alive": limits.header_seconds,
            "h11_max_incomplete_event_size": limits.header_bytes}
