"""A deadline for request headers, which uvicorn does not have, and no connection kept for a
request body nobody will read.

uvicorn's `timeout_keep_alive` covers only the idle time between requests and is reset by
every byte received, so a client that sends its headers a byte at a time ("slowloris")
holds a connection for as long as it likes. This protocol gives each request's headers a
fixed time from the moment the server starts waiting for them (the connection opening,
or the first byte after the previous response): once they are not all there, the server
answers 408 and closes. The body's own deadline is kept by `service.api.body_limits` while
the app reads it; once the response is complete the app cannot read it any more, so a body
not fully received by then is not read on: the connection closes.
"""

from __future__ import annotations

import asyncio

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

_TIMEOUT_BODY = b"request headers not sent in time"
_TIMEOUT_RESPONSE = (
    b"HTTP/1.1 408 Request Timeout\r\n"
    b"content-type: text/plain; charset=utf-8\r\n"
    b"content-length: %d\r\n"
    b"connection: close\r\n\r\n%s" % (len(_TIMEOUT_BODY), _TIMEOUT_BODY)
)


class HeaderDeadlineProtocol(H11Protocol):
    """uvicorn's h11 protocol, closing connections whose headers arrive too slowly."""

    header_timeout: float = 10.0

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._header_timer: asyncio.TimerHandle | None = None
        self._heard = False
        self._arm_header_timer()

    def data_received(self, data: bytes) -> None:
        waiting = self.conn.their_state is h11.IDLE  # no request line parsed yet
        if waiting and self._header_timer is None:
            self._arm_header_timer()  # the first byte of a request after a keep-alive pause
        self._heard = self._heard or (waiting and bool(data))
        super().data_received(data)
        if self.conn.their_state is not h11.IDLE:  # headers complete: the body has its own
            self._disarm_header_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm_header_timer()
        super().connection_lost(exc)

    def on_response_complete(self) -> None:
        self._heard = False
        if self.conn.their_state is h11.SEND_BODY and not self.transport.is_closing():
            # Answered before the whole body arrived: uvicorn would read the rest with no
            # deadline and no limit (its keep-alive timer is cancelled by every byte), and
            # nothing can use it now. The app marks such answers `Connection: close`; this
            # holds for any answer that did not pass through it.
            self.transport.close()
        super().on_response_complete()

    def _arm_header_timer(self) -> None:
        self._disarm_header_timer()
        self._header_timer = self.loop.call_later(self.header_timeout, self._headers_late)

    def _disarm_header_timer(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _headers_late(self) -> None:
        self._header_timer = None
        if self.transport.is_closing() or self.conn.their_state is not h11.IDLE:
            return
        if self._heard:  # part of a request arrived: say why it is dropped
            self.transport.write(_TIMEOUT_RESPONSE)
        self.transport.close()


def header_deadline_protocol(header_timeout: float) -> type[HeaderDeadlineProtocol]:
    """The protocol class for `uvicorn.Config(http=...)` with this header timeout."""
    return type(
        "HeaderDeadlineProtocol",
        (HeaderDeadlineProtocol,),
        {"header_timeout": header_timeout},
    )
