"""Waiting claims against a real `repro serve`: a client that leaves frees its slot at once,
and one worker token cannot hold every slot while another token waits for work."""

from __future__ import annotations

import socket
import time
from pathlib import Path

import httpx

from tests.integration.service_procs import Service

PER_TOKEN = 2


def _serve(tmp_path: Path, total: int) -> Service:
    env = {
        "REPRO_MAX_WAITING_CLAIMS": str(total),
        "REPRO_MAX_WAITING_CLAIMS_PER_TOKEN": str(PER_TOKEN),
    }
    return Service(tmp_path / "data", extra=("--no-demo",), env=env).wait_ready()


def _worker(service: Service, name: str) -> tuple[str, str]:
    """A worker token and the claim path of a worker registered with it."""
    token = service.token("worker", name)
    registered = httpx.post(
        f"{service.url}/api/v1/workers/register",
        json={"name": name},
        headers={"Authorization": f"Bearer {token}"},
    )
    assert registered.status_code == 201, registered.text
    return token, f"/api/v1/workers/{registered.json()['id']}/claim"


def _open_waiting_claim(service: Service, token: str, path: str) -> socket.socket:
    """A claim that waits 30 s on the server, sent on a socket the test can close."""
    sock = socket.create_connection(("127.0.0.1", service.port))
    sock.sendall(
        f"POST {path}?wait=30 HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        f"Authorization: Bearer {token}\r\nContent-Length: 0\r\n\r\n".encode()
    )
    return sock


def _claim(service: Service, token: str, path: str, wait: float) -> httpx.Response:
    return httpx.post(
        f"{service.url}{path}?wait={wait}",
        headers={"Authorization": f"Bearer {token}"},
        timeout=60,
    )


def _until_full(service: Service, token: str, path: str, setting: str) -> None:
    """Return once the waiting claims hold their slots (the next waiting claim gets 503)."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        answer = _claim(service, token, path, 0.5)
        if answer.status_code == 503:
            assert setting in answer.text
            assert int(answer.headers["Retry-After"]) >= 1
            return
        time.sleep(0.1)
    raise AssertionError("the waiting claims never took their slots")


def _until_free(service: Service, token: str, path: str) -> None:
    left = time.monotonic()
    while _claim(service, token, path, 0.2).status_code == 503:
        assert time.monotonic() - left < 10, "slots of clients that left are still held"
        time.sleep(0.1)


def test_a_client_that_leaves_frees_its_waiting_slot_at_once(tmp_path: Path) -> None:
    service = _serve(tmp_path, total=PER_TOKEN)
    try:
        token, path = _worker(service, "leaver")
        socks = [_open_waiting_claim(service, token, path) for _ in range(PER_TOKEN)]
        try:
            _until_full(service, token, path, "REPRO_MAX_WAITING_CLAIMS")
        finally:
            for sock in socks:
                sock.close()
        # Well before the 30 s the claims asked to wait.
        _until_free(service, token, path)
    finally:
        service.stop()


def test_one_token_cannot_take_every_waiting_slot(tmp_path: Path) -> None:
    service = _serve(tmp_path, total=4 * PER_TOKEN)
    try:
        greedy, greedy_path = _worker(service, "greedy")
        other, other_path = _worker(service, "other")
        socks = [_open_waiting_claim(service, greedy, greedy_path) for _ in range(PER_TOKEN)]
        try:
            _until_full(service, greedy, greedy_path, "REPRO_MAX_WAITING_CLAIMS_PER_TOKEN")
            # Another token still gets a slot: it waits, then finds nothing (204, not 503).
            started = time.monotonic()
            assert _claim(service, other, other_path, 1).status_code == 204
            assert time.monotonic() - started >= 0.9
        finally:
            for sock in socks:
                sock.close()
        _until_free(service, greedy, greedy_path)
    finally:
        service.stop()
