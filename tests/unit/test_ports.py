"""Test processes run in parallel are handed ports from blocks no other one uses."""

from __future__ import annotations

import socket

import pytest

from tests import ports


def _ports_for(monkeypatch: pytest.MonkeyPatch, worker: str | None, count: int) -> set[int]:
    if worker is None:
        monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    else:
        monkeypatch.setenv("PYTEST_XDIST_WORKER", worker)
    return {ports.free_port() for _ in range(count)}


def test_each_test_process_has_its_own_block_below_the_ephemeral_range(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    taken = {w: _ports_for(monkeypatch, w, 50) for w in (None, "gw0", "gw1", "gw5")}
    for worker, got in taken.items():
        assert len(got) == 50, worker  # no port handed out twice in a row
        others = set().union(*(p for w, p in taken.items() if w != worker))
        assert not got & others, worker
        assert all(ports.FIRST_PORT <= p < 32768 for p in got), worker


def test_a_port_something_else_holds_is_skipped(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw2")
    first = ports.free_port()
    start = first - (first - ports.FIRST_PORT) % ports.BLOCK

    def after(port: int, steps: int) -> int:
        return start + (port - start + steps) % ports.BLOCK

    with socket.socket() as holder:
        holder.bind((ports.HOST, after(first, 1)))  # the next candidate, held elsewhere
        holder.listen()
        assert ports.free_port() == after(first, 2)
