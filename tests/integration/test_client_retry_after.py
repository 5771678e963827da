"""The Python client against a real `repro serve` that throttles: an address that keeps
sending invalid tokens meets `REPRO_AUTH_FAILURES_PER_ADDRESS` and gets 429 with
Retry-After. The client waits what each answer asks, retries up to its limit, then raises
an ApiError carrying the API's reason; once the noise stops, its retry after the wait gets
the API's real answer (the token is invalid, 401), which is not retried.

Every request is recorded on its way through a real HTTP transport, so the waits between
attempts are measured, not assumed.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from reprotrain import ApiError, Client
from tests.integration.service_procs import Service

PER_ADDRESS = 5
WINDOW = 2  # seconds: the server's Retry-After is at most WINDOW + 1
NOISE_EVERY = 0.05  # seconds between the other program's bad requests
BAD_TOKEN = "rpt_424242_" + "x" * 43  # well formed, but no such token


@dataclass
class Attempt:
    sent: float
    status: int
    retry_after: float | None


class Recording(httpx.BaseTransport):
    """A real HTTP transport that notes when each request left and what came back."""

    def __init__(self) -> None:
        self.inner = httpx.HTTPTransport()
        self.attempts: list[Attempt] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        sent = time.monotonic()
        response = self.inner.handle_request(request)
        asked = response.headers.get("Retry-After")
        self.attempts.append(Attempt(sent, response.status_code, float(asked) if asked else None))
        return response

    def close(self) -> None:
        self.inner.close()


class Noise:
    """Another program on the same address sending a new invalid token id every
    NOISE_EVERY s; bounded in count and time, and stopped by `stop`."""

    def __init__(self, url: str) -> None:
        self.url, self.stopped = url, threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        deadline = time.monotonic() + 60
        with httpx.Client(base_url=self.url, timeout=10) as http:
            for n in range(2000):
                if self.stopped.is_set() or time.monotonic() > deadline:
                    return
                token = f"rpt_{10_000 + n}_" + "z" * 43
                http.get("/api/v1/runs", headers={"Authorization": f"Bearer {token}"})
                self.stopped.wait(NOISE_EVERY)

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self.stopped.set()
        self.thread.join(timeout=30)


@pytest.fixture
def service(tmp_path: Path) -> Iterator[Service]:
    env = {
        "REPRO_AUTH_FAILURES_ALLOWED": "10000",  # only the per-address ceiling applies
        "REPRO_AUTH_FAILURES_PER_ADDRESS": str(PER_ADDRESS),
        "REPRO_AUTH_FAILURE_WINDOW_SECONDS": str(WINDOW),
    }
    svc = Service(tmp_path / "data", env=env, extra=("--no-demo",))
    try:
        yield svc.wait_ready()
    finally:
        svc.stop()


def waited_as_asked(attempts: list[Attempt]) -> None:
    for before, after in itertools.pairwise(attempts):
        assert before.retry_after is not None, attempts
        gap = after.sent - before.sent
        # Never sooner than asked; the upper bound is loose, for a loaded machine.
        assert before.retry_after - 0.05 <= gap <= before.retry_after + 15, attempts


def test_the_client_waits_retry_after_then_raises_the_apis_reason(service: Service) -> None:
    noise = Noise(service.url)
    noise.start()
    try:
        deadline = time.monotonic() + 30
        while (
            service.client.get("/api/v1/runs", headers={"Authorization": "Bearer x"}).status_code
            != 429
        ):
            assert time.monotonic() < deadline, "the address never met its ceiling"
            time.sleep(0.1)
        recording = Recording()
        with (
            Client(service.url, BAD_TOKEN, retries=2, transport=recording) as client,
            pytest.raises(ApiError) as throttled,
        ):
            client.runs_page()
        attempts = recording.attempts
        assert [a.status for a in attempts] == [429, 429, 429], attempts
        assert all(a.retry_after is not None and 1 <= a.retry_after <= WINDOW + 1 for a in attempts)
        waited_as_asked(attempts)
        error = throttled.value
        assert error.status_code == 429
        assert error.reason.startswith("too many invalid tokens; retry in"), error.reason
        assert error.retry_after == attempts[-1].retry_after
    finally:
        noise.stop()

    # The noise has stopped: after the wait asked, the address is below its ceiling and the
    # API's real answer comes back; a 401 is final, so it is raised at once.
    recording = Recording()
    with (
        Client(service.url, BAD_TOKEN, retries=3, transport=recording) as client,
        pytest.raises(ApiError) as refused,
    ):
        client.runs_page()
    attempts = recording.attempts
    statuses = [a.status for a in attempts]
    assert statuses[-1] == 401 and set(statuses[:-1]) <= {429}, attempts
    waited_as_asked(attempts)
    assert refused.value.status_code == 401
