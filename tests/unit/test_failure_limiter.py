"""The bad-token ceiling's Retry-After: a client that waits as told is let through."""

from __future__ import annotations

import pytest

from service.auth import tokens


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.mark.parametrize("per_address", [False, True])
def test_waiting_the_retry_after_of_spread_out_failures_gets_through(
    monkeypatch: pytest.MonkeyPatch, per_address: bool
) -> None:
    clock = Clock()
    monkeypatch.setattr(tokens.time, "monotonic", clock)
    limiter = (
        tokens.FailureLimiter(100, 10.0, max_per_address=3)
        if per_address
        else tokens.FailureLimiter(3, 10.0)
    )
    # Failures 3 s apart: at the fourth, the oldest expires long before the third does.
    for i in range(3):
        identity = f"id{i}" if per_address else "id"
        assert limiter.failed("10.0.0.1", identity) is None
        clock.now += 3.0
    refused = limiter.failed("10.0.0.1", "id3" if per_address else "id")
    assert refused is not None and refused.retry_after is not None
    clock.now += refused.retry_after
    # Waiting exactly as told: the next bad token is counted, not refused.
    assert limiter.failed("10.0.0.1", "id4" if per_address else "id") is None


def test_a_burst_is_refused_until_it_leaves_the_window(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = Clock()
    monkeypatch.setattr(tokens.time, "monotonic", clock)
    limiter = tokens.FailureLimiter(3, 10.0)
    for _ in range(3):
        assert limiter.failed("10.0.0.1", "id") is None
    refused = limiter.failed("10.0.0.1", "id")
    assert refused is not None and refused.retry_after == 11
    clock.now += 9.0
    assert limiter.failed("10.0.0.1", "id") is not None  # still inside the window
