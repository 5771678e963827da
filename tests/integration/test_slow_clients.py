"""Slow clients against a real `repro serve` process: headers and bodies trickled a byte at
a time, a connection that never sends a request, and a kept-alive connection that stops
mid-request. The server must cut each off at its deadline and keep serving others.

Every test talks to 127.0.0.1 only, sends a bounded amount and stops by itself.
"""

from __future__ import annotations

import select
import socket

from tests.integration.hostile_clients import (
    CLIENT_PATIENCE,
    answer_status,
    service,
    still_serves,
)
from tests.integration.service_procs import Service

__all__ = ["service"]


def _trickle(port: int, head: bytes, trickle: bytes, every: float) -> tuple[bytes, int]:
    """Send `head`, then `trickle` a byte at a time; stop when the server answers or closes.

    Returns (what the server sent, bytes of `trickle` sent by then).
    """
    with socket.create_connection(("127.0.0.1", port), timeout=CLIENT_PATIENCE) as sock:
        sock.sendall(head)
        for sent in range(len(trickle)):
            readable, _, _ = select.select([sock], [], [], every)
            if readable:
                return _drain(sock), sent
            try:
                sock.sendall(trickle[sent : sent + 1])
            except (BrokenPipeError, ConnectionResetError):
                return _drain(sock), sent
        return _drain(sock), len(trickle)


def _drain(sock: socket.socket) -> bytes:
    data = b""
    try:
        while piece := sock.recv(65536):
            data += piece
    except ConnectionResetError:
        pass
    return data


def test_headers_sent_a_byte_at_a_time_are_cut_off(service: Service) -> None:
    # 200 header bytes at 4 a second would take 50 s; the server allows 1 s for headers.
    trickle = b"X-Slow: " + b"a" * 190 + b"\r\n\r\n"
    answer, sent = _trickle(service.port, b"GET /healthz HTTP/1.1\r\nHost: x\r\n", trickle, 0.25)
    assert sent < len(trickle), "the server waited for the whole trickle"
    assert answer == b"" or answer_status(answer) == 408, answer[:200]
    still_serves(service)


def test_a_connection_that_never_sends_a_request_is_closed(service: Service) -> None:
    with socket.create_connection(("127.0.0.1", service.port), timeout=CLIENT_PATIENCE) as sock:
        assert sock.recv(100) == b""  # closed by the server, long before the client gives up


def test_a_body_sent_a_byte_at_a_time_is_answered_408(service: Service) -> None:
    # 200 body bytes at 4 a second would take 50 s; the server allows about 2 s for the body.
    head = (
        b"POST /api/v1/runs/1/heartbeat HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Authorization: Bearer %s\r\nContent-Length: 200\r\n\r\n" % service.admin_token.encode()
    )
    answer, sent = _trickle(service.port, head, b" " * 200, 0.25)
    assert sent < 200, "the server waited for the whole trickle"
    assert answer_status(answer) == 408, answer[:200]
    still_serves(service)


def test_requests_on_a_kept_alive_connection_still_get_their_header_deadline(
    service: Service,
) -> None:
    with socket.create_connection(("127.0.0.1", service.port), timeout=CLIENT_PATIENCE) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        first = b""
        while b"\r\n\r\n" not in first:
            first += sock.recv(65536)
        assert answer_status(first) == 200
        sock.sendall(b"GET /healthz HTTP/1.1\r\n")  # and the rest never comes
        rest = _drain(sock)
    # (the first answer's body may arrive with the second answer)
    assert b"HTTP/1.1 408 " in first + rest, (first + rest)[:400]
