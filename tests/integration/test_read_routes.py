"""Where the hot read routes run: on the event loop with SQLite (no thread-pool slot), in
the thread pool with PostgreSQL (a slow database then holds up a thread, not the loop).
The app runs in-process so the test can take every thread-pool slot first."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import datetime
from pathlib import Path
from typing import Any

import anyio.to_thread
import httpx
import pytest
from fastapi import FastAPI
from sqlalchemy import event, select, text, update

from service.app import create_app
from service.auth import create_token
from service.config import Settings
from service.migrate import upgrade
from service.models import ApiToken, Run
from tests.integration.jobs import REPO

SEED001 = (REPO / "examples" / "seed001.yaml").read_text()


@pytest.fixture
def settings(migrated_settings: Settings) -> Settings:
    return migrated_settings


@asynccontextmanager
async def _client_with_a_run(app: FastAPI) -> AsyncIterator[tuple[httpx.AsyncClient, int]]:
    """A submitter's client of the in-process app, and the run its submission queued."""
    with app.state.sessionmaker() as db:
        secret = create_token(db=db, name="submitter", role="submitter")[1]
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app),
        base_url="http://api",
        headers={"Authorization": f"Bearer {secret}"},
        timeout=30,
    ) as client:
        submitted = await client.post(
            "/api/v1/experiments", content=SEED001, headers={"Content-Type": "application/yaml"}
        )
        assert submitted.status_code == 201, submitted.text
        yield client, submitted.json()["run"]["id"]


def test_reads_of_runs_need_a_thread_only_on_a_server_database(settings: Settings) -> None:
    app = create_app(settings)
    on_loop = settings.resolved_database_url.startswith("sqlite")

    async def main() -> None:
        async with _client_with_a_run(app) as (client, run_id):
            paths = [f"/api/v1/runs/{run_id}", "/api/v1/runs?limit=5"]
            before = [(await client.get(p)).json() for p in paths]  # the token is cached now

            limiter = anyio.to_thread.current_default_thread_limiter()
            holders = [object() for _ in range(int(limiter.total_tokens))]
            for holder in holders:
                await limiter.acquire_on_behalf_of(holder)
            try:
                reads = [asyncio.create_task(client.get(p)) for p in paths]
                done, _ = await asyncio.wait(reads, timeout=2)
                assert len(done) == (len(paths) if on_loop else 0)
            finally:
                for holder in holders:
                    limiter.release_on_behalf_of(holder)
            answers = [await asyncio.wait_for(r, 20) for r in reads]
        assert [a.status_code for a in answers] == [200, 200]
        assert [a.json() for a in answers] == before
        assert answers[1].json()["items"][0]["id"] == run_id

    try:
        asyncio.run(main())
    finally:
        app.state.engine.dispose()


def test_concurrent_reads_keep_their_connections_instead_of_opening_new_ones(
    settings: Settings,
) -> None:
    """Rounds of reads in flight together open the connections they need once: the pool
    keeps every connection up to the thread pool's size, where a smaller kept pool closed
    the overflow on return and steady load opened a new server connection every few
    requests."""
    in_flight, rounds = 16, 12
    app = create_app(settings)
    opened: list[object] = []
    event.listen(app.state.engine, "connect", lambda dbapi_conn, record: opened.append(record))

    async def main() -> list[int]:
        async with _client_with_a_run(app) as (client, run_id):
            paths = [f"/api/v1/runs/{run_id}", "/api/v1/runs?limit=5"]
            statuses = []
            for _ in range(rounds):
                answers = await asyncio.gather(
                    *(client.get(paths[i % 2]) for i in range(in_flight))
                )
                statuses += [a.status_code for a in answers]
            return statuses

    try:
        statuses = asyncio.run(main())
    finally:
        app.state.engine.dispose()
    assert statuses == [200] * (in_flight * rounds)
    # At most one per request in flight (the submission's is among them); at least one.
    assert 1 <= len(opened) <= in_flight, f"{len(opened)} connections opened for {in_flight}"


def test_a_page_shows_a_runs_times_as_its_detail_does(settings: Settings) -> None:
    """A page reads a run's columns without the ORM (on SQLite its datetimes as the stored
    text); every field it shows equals the detail's, times to the microsecond, with a `Z`."""
    app = create_app(settings)
    times = {
        "started_at": datetime(2026, 1, 2, 3, 4, 5),  # no fraction: written without one
        "finished_at": datetime(2026, 1, 2, 3, 4, 6, 7),
        "lease_expires_at": datetime(2026, 12, 31, 23, 59, 59, 999999),
    }

    async def main() -> tuple[dict[str, Any], dict[str, Any]]:
        async with _client_with_a_run(app) as (client, run_id):
            with app.state.sessionmaker() as db:
                db.execute(update(Run).where(Run.id == run_id).values(**times))
                db.commit()
            detail = (await client.get(f"/api/v1/runs/{run_id}")).json()
            page = (await client.get("/api/v1/runs?limit=5")).json()
        [item] = [i for i in page["items"] if i["id"] == run_id]
        return item, detail

    try:
        item, detail = asyncio.run(main())
    finally:
        app.state.engine.dispose()
    assert item["started_at"] == "2026-01-02T03:04:05Z"
    assert item["finished_at"] == "2026-01-02T03:04:06.000007Z"
    assert item["lease_expires_at"] == "2026-12-31T23:59:59.999999Z"
    assert item["created_at"].endswith("Z")
    assert item == {key: detail[key] for key in item}


def test_a_read_session_refuses_to_write(settings: Settings) -> None:
    """The routes that only read get sessions that raise at a flush with changes, before
    anything reaches the database, instead of writing (piecemeal, on PostgreSQL, where
    they run in autocommit)."""
    app = create_app(settings)
    try:
        with app.state.read_sessionmaker() as db, pytest.raises(RuntimeError, match="not write"):
            create_token(db=db, name="through-a-read", role="viewer")
        with app.state.sessionmaker() as db:
            assert db.scalars(select(ApiToken.name)).all() == []
    finally:
        app.state.engine.dispose()


def test_repeated_reads_run_as_prepared_statements_on_postgresql(
    postgres_url: str, tmp_path: Path
) -> None:
    """psycopg forgets a connection's prepared statements at every rollback, and every read
    used to end in one, so PostgreSQL parsed and planned each statement of each read anew.
    The read routes now read in autocommit: on a pool of one connection, after a few
    details and pages their statements are prepared on it."""
    settings = Settings(
        data_dir=tmp_path / "data", database_url=postgres_url, db_pool_size=1, db_max_overflow=0
    )
    upgrade(settings.resolved_database_url)
    app = create_app(settings)

    async def main() -> None:
        async with _client_with_a_run(app) as (client, run_id):
            for _ in range(8):
                assert (await client.get(f"/api/v1/runs/{run_id}")).status_code == 200
                assert (await client.get("/api/v1/runs?limit=5")).status_code == 200

    try:
        asyncio.run(main())
        with app.state.read_sessionmaker() as db:
            prepared = db.scalars(text("SELECT statement FROM pg_prepared_statements")).all()
    finally:
        app.state.engine.dispose()
    assert any("FROM trace_points" in s for s in prepared), prepared  # the detail's trace
    assert any("LIMIT" in s and "FROM runs" in s for s in prepared), prepared  # a page
