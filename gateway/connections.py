"""Connection timeouts for uvicorn: no client may hold a connection by sending slowly or not at all.

uvicorn closes idle keep-alive connections (timeout_keep_alive) but never times
out a request being read: a client that connects and sends nothing, or sends its
headers a byte at a time, or declares a body and stalls, holds its connection and
its slot forever. TimedHttpToolsProtocol adds the missing deadlines:

- headers: a request's complete headers must arrive within header_timeout_s of
  its first byte (for a new connection, of the connection itself);
- body: the whole body must arrive within body_timeout_s of the headers. The
  request middleware answers 408 at body_timeout_s when the app is waiting for
  the body; this deadline, BODY_GRACE_S later, closes what is left (a client
  still dripping a body nobody reads);
- between requests: the keep-alive timeout, also when the client sent the rest of
  a body after its response was complete (uvicorn cancels its timer on any data).

A deadline that passes closes the connection.
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from gateway.settings import GatewaySettings

BODY_GRACE_S = 2.0


class TimedHttpToolsProtocol(HttpToolsProtocol):
    header_timeout_s: float = 10.0
    body_timeout_s: float = 60.0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._deadline: asyncio.TimerHandle | None = None
        self._in_message = False

    # -- the deadline -------------------------------------------------------------------

    def _arm(self, seconds: float) -> None:
        self._disarm()
        self._deadline = self.loop.call_later(seconds, self._expired)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _expired(self) -> None:
        self._deadline = None
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()

    def _between_requests(self) -> bool:
        return not self._in_message and (self.cycle is None or self.cycle.response_complete)

    # -- uvicorn's hooks ------------------------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm(self.header_timeout_s)

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        # Bytes between requests start the next request's header deadline (stray CRLFs included).
        if self._deadline is None and self._between_requests():
            self._arm(self.header_timeout_s)
        super().data_received(data)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._in_message = True
        if self._deadline is None:
            self._arm(self.header_timeout_s)

    def on_headers_complete(self) -> None:
        self._arm(self.body_timeout_s + BODY_GRACE_S)
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        self._in_message = False
        self._disarm()
        if self.cycle is not None and self.cycle.response_complete:
            # Answered before its body was in (a 413, a 401): now idle, under the keep-alive timeout.
            self._arm(self.timeout_keep_alive)
        super().on_message_complete()


def timed_protocol(*, header_timeout_s: float, body_timeout_s: float) -> type[TimedHttpToolsProtocol]:
    """A protocol class with these deadlines, for uvicorn's `http=` option."""
    return type(
        "TimedHttpToolsProtocol",
        (TimedHttpToolsProtocol,),
        {"header_timeout_s": header_timeout_s, "body_timeout_s": body_timeout_s},
    )


def uvicorn_options(settings: GatewaySettings) -> dict[str, Any]:
    """uvicorn.Config/uvicorn.run keyword arguments that bound how long a connection may take."""
    return {
        "http": timed_protocol(header_timeout_s=settings.header_timeout_s, body_timeout_s=settings.body_timeout_s),
        "timeout_keep_alive": settings.keep_alive_timeout_s,
    }
