"""Requests that wait on the server: claims (long polls) woken by a submission, bounded, and
ended when the server stops; run event streams woken by a write to the run. The app runs
in-process so the test can see that a request is waiting."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from service.api.routes import runs as runs_routes
from service.api.routes import workers as workers_routes
from service.app import create_app
from service.auth.tokens import create_token
from service.config import Settings
from service.persistence.migrate import upgrade
from tests.integration.jobs import REPO

SEED001 = (REPO / "examples" / "seed001.yaml").read_text()
Scenario = Callable[[Any, httpx.AsyncClient, httpx.AsyncClient, str], Awaitable[None]]


@pytest.fixture(params=["sqlite", "postgresql"])
def settings(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Settings:
    # No look on its own within a test: only a bell can wake a waiting request in time.
    monkeypatch.setattr(workers_routes, "_RECHECK_SECONDS", 60.0)
    monkeypatch.setattr(runs_routes, "_EVENTS_RECHECK_SECONDS", 60.0)
    url = "" if request.param == "sqlite" else request.getfixturevalue("postgres_url")
    settings = Settings(data_dir=tmp_path / "data", database_url=url)
    upgrade(settings.resolved_database_url)
    return settings


def scenario(settings: Settings, body: Scenario) -> None:
    """Run `body(app, submitter, worker, claim_path)` against the app, with a worker registered."""
    app = create_app(settings)
    with app.state.sessionmaker() as db:
        secrets = {
            role: create_token(db=db, name=role, role=role)[1] for role in ("submitter", "worker")
        }

    async def main() -> None:
        transport = httpx.ASGITransport(app=app)
        clients = {
            role: httpx.AsyncClient(
                transport=transport,
                base_url="http://api",
                headers={"Authorization": f"Bearer {secret}"},
                timeout=60,
            )
            for role, secret in secrets.items()
        }
        try:
            worker = await clients["worker"].post("/api/v1/workers/register", json={"name": "w"})
            path = f"/api/v1/workers/{worker.json()['id']}/claim"
            await body(app, clients["submitter"], clients["worker"], path)
            # A request answered early (the server stopping) closes its database session
            # just after its answer: let it, or the connection outlives the app's engine.
            for _ in range(500):
                if app.state.engine.pool.checkedout() == 0:
                    break
                await asyncio.sleep(0.01)
        finally:
            for client in clients.values():
                await client.aclose()

    try:
        asyncio.run(main())
    finally:
        app.state.engine.dispose()


async def until_waiting(app: Any, bell: str = "queue_bell") -> None:
    """Return once a request is waiting on one of the server's bells."""
    for _ in range(2000):
        if getattr(app.state, bell).listeners:
            return
        await asyncio.sleep(0.005)
    raise AssertionError(f"nothing ever waited on the {bell}")


def test_a_waiting_claim_takes_the_run_submitted_while_it_waits(settings: Settings) -> None:
    async def body(app: Any, submitter: Any, worker: Any, path: str) -> None:
        claim = asyncio.create_task(worker.post(path, params={"wait": 25}))
        await until_waiting(app)  # the queue was empty when the claim looked
        submitted = await submitter.post(
            "/api/v1/experiments", content=SEED001, headers={"Content-Type": "application/yaml"}
        )
        assert submitted.status_code == 201, submitted.text
        got = await asyncio.wait_for(claim, 20)  # far below the 25 s it may wait: woken
        assert got.status_code == 200, got.text
        assert got.json()["run"]["id"] == submitted.json()["run"]["id"]
        assert app.state.queue_bell.listeners == 0

    scenario(settings, body)


def test_a_claim_waits_no_longer_than_asked_and_then_answers_204(settings: Settings) -> None:
    async def body(app: Any, submitter: Any, worker: Any, path: str) -> None:
        assert (await worker.post(path, params={"wait": 0.3})).status_code == 204
        assert (await worker.post(path)).status_code == 204  # no wait: the plain poll
        too_long = await worker.post(path, params={"wait": 31})
        assert too_long.status_code == 422 and "wait" in too_long.text
        assert (await worker.post(path, params={"wait": -1})).status_code == 422

    scenario(settings, body)


def test_a_stopping_server_ends_waiting_claims(settings: Settings) -> None:
    async def body(app: Any, submitter: Any, worker: Any, path: str) -> None:
        claim = asyncio.create_task(worker.post(path, params={"wait": 25}))
        await until_waiting(app)
        app.state.queue_bell.close()
        got = await asyncio.wait_for(claim, 20)
        assert got.status_code == 204

    scenario(settings, body)


def test_a_run_event_stream_is_woken_by_a_write_to_the_run(settings: Settings) -> None:
    async def body(app: Any, submitter: Any, worker: Any, path: str) -> None:
        submitted = await submitter.post(
            "/api/v1/experiments", content=SEED001, headers={"Content-Type": "application/yaml"}
        )
        run_id = submitted.json()["run"]["id"]
        stream = asyncio.create_task(submitter.get(f"/api/v1/runs/{run_id}/events"))
        await until_waiting(app, "runs_bell")  # it has sent the queued state and waits
        cancelled = await submitter.post(f"/api/v1/runs/{run_id}/cancel")
        assert cancelled.status_code == 200, cancelled.text
        got = await asyncio.wait_for(stream, 20)  # the stream ends at the terminal state
        statuses = [
            json.loads(line[len("data: ") :])["status"]
            for line in got.text.splitlines()
            if line.startswith("data: ")
        ]
        assert statuses == ["queued", "cancelled"]

    scenario(settings, body)
