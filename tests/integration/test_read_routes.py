"""Where the hot read routes run: on the event loop, over asyncio connections with
PostgreSQL (no thread-pool slot either way, and a read waiting for the database holds up
no other request). The app runs in-process so the tests can take every thread-pool slot
first."""

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
from sqlalchemy.orm import Session

from service.api import run_pages
from service.api.views import run_outs
from service.app import create_app
from service.auth.tokens import create_token
from service.config import Settings
from service.persistence.migrate import upgrade
from service.persistence.models import ApiToken, Artifact, Run, TracePointRow, Verdict
from service.schemas import RunPage
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


def test_reads_of_runs_need_no_thread(settings: Settings) -> None:
    """With every thread-pool slot taken, a run and a page of runs still answer: on SQLite
    they are read on the event loop, on PostgreSQL over asyncio connections."""
    app = create_app(settings)

    async def main() -> None:
        async with _client_with_a_run(app) as (client, run_id):
            paths = [f"/api/v1/runs/{run_id}", "/api/v1/runs?limit=5"]
            before = [(await client.get(p)).json() for p in paths]  # the token is cached now
            async with _every_thread_slot_taken():
                answers = await asyncio.wait_for(
                    asyncio.gather(*(client.get(p) for p in paths)), 20
                )
        assert [a.status_code for a in answers] == [200, 200]
        assert [a.json() for a in answers] == before
        assert answers[1].json()["items"][0]["id"] == run_id

    try:
        asyncio.run(main())
    finally:
        app.state.engine.dispose()


def test_a_read_waiting_for_postgresql_holds_up_no_other_request(
    postgres_url: str, tmp_path: Path
) -> None:
    """A detail read waits for a lock another connection holds on the trace points; in the
    meantime, with no thread free either, pages of runs and /healthz answer, and the detail
    answers once the lock goes."""
    settings = Settings(data_dir=tmp_path / "data", database_url=postgres_url)
    upgrade(settings.resolved_database_url)
    app = create_app(settings)

    async def main() -> None:
        async with _client_with_a_run(app) as (client, run_id):
            expected = (await client.get(f"/api/v1/runs/{run_id}")).json()
            with app.state.engine.connect() as locker:
                locker.execute(text("LOCK TABLE trace_points IN ACCESS EXCLUSIVE MODE"))
                async with _every_thread_slot_taken():
                    detail = asyncio.create_task(client.get(f"/api/v1/runs/{run_id}"))
                    others = [await client.get("/api/v1/runs?limit=5") for _ in range(3)]
                    others.append(await client.get("/healthz"))
                    assert [o.status_code for o in others] == [200] * 4
                    assert not detail.done()
                    await _backend_waits_for_a_lock(app)
                    locker.rollback()
                    answer = await asyncio.wait_for(detail, 20)
        assert answer.status_code == 200
        assert answer.json() == expected

    try:
        asyncio.run(main())
    finally:
        app.state.engine.dispose()


def test_a_read_that_finds_every_connection_busy_gets_503(
    postgres_url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The read pool's one connection is held by a detail waiting for a lock; a page then
    waits `db_pool_timeout_seconds` for it and gets 503 with Retry-After (not a 500), the
    server logs why, and the held detail and later reads answer once the lock goes."""
    settings = Settings(
        data_dir=tmp_path / "data",
        database_url=postgres_url,
        db_read_pool_size=1,
        db_pool_timeout_seconds=0.5,
    )
    upgrade(settings.resolved_database_url)
    app = create_app(settings)

    async def main() -> None:
        async with _client_with_a_run(app) as (client, run_id):
            detail = f"/api/v1/runs/{run_id}"
            expected = (await client.get(detail)).json()
            with app.state.engine.connect() as locker:
                locker.execute(text("LOCK TABLE trace_points IN ACCESS EXCLUSIVE MODE"))
                held = asyncio.create_task(client.get(detail))
                await _backend_waits_for_a_lock(app)
                busy = await client.get("/api/v1/runs?limit=5")
                locker.rollback()
            answer = await asyncio.wait_for(held, 20)
            later = await client.get("/api/v1/runs?limit=5")
        assert busy.status_code == 503, busy.text
        assert busy.headers["Retry-After"] == "1"
        assert busy.json() == {"detail": "every database connection is busy; try again"}
        assert (answer.status_code, answer.json()) == (200, expected)
        assert later.status_code == 200
        assert later.json()["items"][0]["id"] == run_id

    try:
        asyncio.run(main())
    finally:
        app.state.engine.dispose()
    assert "GET /api/v1/runs: no database connection came free in time" in caplog.text


@asynccontextmanager
async def _every_thread_slot_taken() -> AsyncIterator[None]:
    limiter = anyio.to_thread.current_default_thread_limiter()
    holders = [object() for _ in range(int(limiter.total_tokens))]
    for holder in holders:
        await limiter.acquire_on_behalf_of(holder)
    try:
        yield
    finally:
        for holder in holders:
            limiter.release_on_behalf_of(holder)


async def _backend_waits_for_a_lock(app: FastAPI) -> None:
    """Until PostgreSQL shows a backend waiting for a lock (the detail's read), 10 s at most."""
    query = text(
        "SELECT count(*) FROM pg_stat_activity"
        " WHERE wait_event_type = 'Lock' AND datname = current_database()"
    )
    for _ in range(200):
        with app.state.engine.connect() as conn:
            if conn.scalar(query):
                return
        await asyncio.sleep(0.05)
    raise AssertionError("no read waited for the lock")


def test_concurrent_reads_keep_their_connections_instead_of_opening_new_ones(
    settings: Settings,
) -> None:
    """Rounds of reads in flight together open the connections they need once: their pool
    keeps every connection it opened, where a kept pool smaller than what was open closed
    the overflow on return and steady load opened a new server connection every few
    requests."""
    in_flight, rounds = 16, 12
    app = create_app(settings)
    opened: list[object] = []
    event.listen(
        app.state.loop_reads.engine, "connect", lambda dbapi_conn, record: opened.append(record)
    )

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


def test_a_page_is_written_byte_for_byte_as_runpage_writes_its_runs(settings: Settings) -> None:
    """A page is written from its rows without validating them into models first; its body
    is the bytes `RunPage` gives for the same runs loaded through the ORM: every field,
    JSON columns with non-ASCII text and floats, verdicts, reference marks, the cursor."""
    app = create_app(settings)

    async def main() -> tuple[bytes, list[int]]:
        async with _client_with_a_run(app) as (client, first):
            rerun = (await client.post(f"/api/v1/runs/{first}/rerun")).json()["id"]
            failed = (await client.post(f"/api/v1/runs/{first}/rerun")).json()["id"]
            queued = (await client.post(f"/api/v1/runs/{first}/rerun")).json()["id"]
            with app.state.sessionmaker() as db:
                done = {
                    "status": "succeeded",
                    "started_at": datetime(2026, 1, 2, 3, 4, 5),
                    "finished_at": datetime(2026, 1, 2, 3, 5, 0, 250),
                    "final_fingerprint": "blake3:" + "ab" * 32,
                    "progress": {"epoch": 3, "loss": 0.1 + 0.2, "note": "fertig ✓ \u2028"},
                }
                db.execute(update(Run).where(Run.id.in_([first, rerun])).values(**done))
                error = {"type": "ValueError", "message": 'bad "value"\n', "traceback": None}
                db.execute(update(Run).where(Run.id == failed).values(status="failed", error=error))
                db.execute(
                    update(Run)
                    .where(Run.id == queued)
                    .values(required_image="img@sha256:" + "0" * 64, attempt=2)
                )
                report = {"verdict": "identical", "explanation": "the same", "a": first}
                db.add(
                    Verdict(
                        run_id=rerun, reference_run_id=first, verdict="identical", report=report
                    )
                )
                db.commit()
            answer = await client.get("/api/v1/runs?limit=3")
            assert answer.status_code == 200, answer.text
            assert answer.headers["content-type"] == "application/json"
            return answer.content, [queued, failed, rerun, first]

    try:
        body, newest_first = asyncio.run(main())
        with app.state.sessionmaker() as db:
            runs = {r.id: r for r in db.scalars(select(Run).where(Run.id.in_(newest_first)))}
            items = run_outs(db, [runs[run_id] for run_id in newest_first[:3]])
    finally:
        app.state.engine.dispose()
    expected = RunPage(
        items=items,
        next_cursor=run_pages.encode_cursor(newest_first[2]),
        total=None,
        limit=3,
        offset=0,
    )
    assert body == expected.model_dump_json().encode()
    marks = {item.id: (item.verdict, item.is_reference) for item in items}
    assert marks[newest_first[2]] == ("identical", False)


def _point(seq: int, kind: str, epoch: int, step: int) -> dict[str, Any]:
    return {
        "seq": seq,
        "kind": kind,
        "epoch": epoch,
        "step": step,
        "fingerprint": f"blake3:{kind}-{epoch}-{step}",
        # Names a database's JSON functions must escape, in an order that is not sorted.
        "variables": {
            "dense/kernel:0": f"k{step}",
            'emb "quoted" \\ é ✓/bias:0': f"b{step}",
            "a/b\tc:0": "\u2028",
        },
    }


def _artifact(run_id: int, name: str, epoch: int | None) -> Artifact:
    return Artifact(
        run_id=run_id,
        kind="checkpoint",
        name=name,
        epoch=epoch,
        sha256="0" * 64,
        size=1,
        storage_url="file:///nowhere",
        attempt=1,
    )


def test_a_runs_detail_is_read_in_one_statement(settings: Settings) -> None:
    """A run's detail reads its row, experiment, verdict, trace, checkpoint names and family
    reference in one statement (a queued run's live workers in one more), and shows each
    as stored: trace points in recorded order whatever order they were written in, the
    newest complete checkpoints, the reference mark. A report stored in an older format is
    built again for the answer and left as it is."""
    app = create_app(settings)
    points = [_point(0, "init", 0, 0), _point(1, "epoch", 1, 6), _point(2, "epoch", 2, 12)]
    statements: list[str] = []

    async def main() -> dict[str, Any]:
        async with _client_with_a_run(app) as (client, first):
            rerun = (await client.post(f"/api/v1/runs/{first}/rerun")).json()["id"]
            old = (await client.post(f"/api/v1/runs/{first}/rerun")).json()["id"]
            pinned = (await client.post(f"/api/v1/runs/{first}/rerun")).json()["id"]
            with app.state.sessionmaker() as db:
                done = {
                    "status": "succeeded",
                    "trace_granularity": "epoch",
                    "final_fingerprint": points[-1]["fingerprint"],
                }
                db.execute(update(Run).where(Run.id.in_([first, rerun, old])).values(**done))
                db.execute(update(Run).where(Run.id == pinned).values(required_image="img:nowhere"))
                for run_id in (first, rerun, old):
                    # Written out of order: the detail orders by the recorded sequence.
                    for point in (points[2], points[0], points[1]):
                        db.add(TracePointRow(run_id=run_id, **point))
                # Epoch 1 and step 9 are complete; epoch 2 lacks its json.
                names = [("epoch-000001", 1), ("step-000000009", None), ("epoch-000002", 2)]
                for stem, epoch in names:
                    for ext in ("npz", "json"):
                        if stem != "epoch-000002" or ext == "npz":
                            db.add(_artifact(first, f"{stem}.{ext}", epoch))
                report = {"verdict": "identical", "explanation": "the same", "a": first}
                db.add(
                    Verdict(
                        run_id=rerun, reference_run_id=first, verdict="identical", report=report
                    )
                )
                stale = {"verdict": "alike"}  # not a verdict a report has now
                db.add(
                    Verdict(run_id=old, reference_run_id=first, verdict="identical", report=stale)
                )
                db.commit()
            ids = {"first": first, "rerun": rerun, "old": old, "pinned": pinned}
            answers = {}
            for name, run_id in ids.items():
                statements.clear()
                answer = await client.get(f"/api/v1/runs/{run_id}")
                assert answer.status_code == 200, answer.text
                answers[name] = {**answer.json(), "statements": len(statements)}
            missing = await client.get("/api/v1/runs/999999")
            assert missing.status_code == 404
            with app.state.sessionmaker() as db:
                answers["stored"] = db.scalar(select(Verdict.report).where(Verdict.run_id == old))
            return answers

    def count(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        statements.append(statement)

    event.listen(app.state.loop_reads.engine, "before_cursor_execute", count)
    try:
        answers = asyncio.run(main())
    finally:
        app.state.engine.dispose()
    trace = [{k: v for k, v in p.items() if k != "seq"} for p in points]
    first, rerun, old, pinned = (answers[k] for k in ("first", "rerun", "old", "pinned"))
    assert [first["statements"], rerun["statements"]] == [1, 1]
    assert first["trace"] == rerun["trace"] == trace
    # Each point's variables keep the order they were recorded in.
    assert [list(p["variables"]) for p in first["trace"]] == [list(p["variables"]) for p in trace]
    assert (first["checkpoint_epoch"], first["checkpoint_step"]) == (1, 9)
    assert (rerun["checkpoint_epoch"], rerun["checkpoint_step"]) == (None, None)
    assert [first["is_reference"], rerun["is_reference"], pinned["is_reference"]] == [
        True,
        False,
        False,
    ]
    assert (first["verdict"], first["verdict_report"], first["reference_run_id"]) == (
        None,
        None,
        None,
    )
    assert rerun["verdict"] == "identical"
    assert rerun["reference_run_id"] == first["id"]
    assert rerun["verdict_report"]["explanation"] == "the same"
    assert rerun["spec"] == first["spec"] and rerun["seed"] == first["seed"]
    assert old["verdict_report"]["verdict"] == "identical"  # compared again: same trace
    assert old["verdict_report"]["b"] == old["id"]
    assert answers["stored"] == {"verdict": "alike"}
    assert pinned["statements"] == 2  # its row, then the live workers
    assert "img:nowhere" in pinned["waiting_reason"]
    assert pinned["trace"] == [] and pinned["status"] == "queued"


def test_a_read_session_refuses_to_write(settings: Settings) -> None:
    """The routes that only read get sessions that raise at a flush with changes, before
    anything reaches the database, instead of writing (piecemeal, on PostgreSQL, where
    they run in autocommit)."""
    app = create_app(settings)

    def write_a_token(db: Session) -> None:
        create_token(db=db, name="through-a-loop-read", role="viewer")

    try:
        with app.state.read_sessionmaker() as db, pytest.raises(RuntimeError, match="not write"):
            create_token(db=db, name="through-a-read", role="viewer")
        with pytest.raises(RuntimeError, match="not write"):
            asyncio.run(app.state.loop_reads.run(write_a_token))
        with app.state.sessionmaker() as db:
            assert db.scalars(select(ApiToken.name)).all() == []
    finally:
        app.state.engine.dispose()


def test_repeated_reads_run_as_prepared_statements_on_postgresql(
    postgres_url: str, tmp_path: Path
) -> None:
    """psycopg forgets a connection's prepared statements at every rollback, and every read
    used to end in one, so PostgreSQL parsed and planned each statement of each read anew.
    The read routes now read in autocommit: on a read pool of one connection, after a few
    details and pages their statements are prepared on it."""
    settings = Settings(data_dir=tmp_path / "data", database_url=postgres_url, db_read_pool_size=1)
    upgrade(settings.resolved_database_url)
    app = create_app(settings)

    def prepared_statements(db: Session) -> list[str]:
        return list(db.scalars(text("SELECT statement FROM pg_prepared_statements")))

    async def main() -> list[str]:
        async with _client_with_a_run(app) as (client, run_id):
            for _ in range(8):
                assert (await client.get(f"/api/v1/runs/{run_id}")).status_code == 200
                assert (await client.get("/api/v1/runs?limit=5")).status_code == 200
        result: list[str] = await app.state.loop_reads.run(prepared_statements)
        return result

    try:
        prepared = asyncio.run(main())
    finally:
        app.state.engine.dispose()
    assert any("FROM trace_points" in s for s in prepared), prepared  # the detail's trace
    assert any("LIMIT" in s and "FROM runs" in s for s in prepared), prepared  # a page


def test_reads_survive_postgresql_closing_their_connections(
    postgres_url: str, tmp_path: Path
) -> None:
    """After PostgreSQL ends every connection the reads keep (as a restart or an idle
    timeout would), the next reads answer: a read whose connection is gone runs again on a
    new one (the pool then drops the other dead ones), without a ping at every checkout."""
    settings = Settings(data_dir=tmp_path / "data", database_url=postgres_url)
    upgrade(settings.resolved_database_url)
    app = create_app(settings)

    async def main() -> None:
        async with _client_with_a_run(app) as (client, run_id):
            paths = [f"/api/v1/runs/{run_id}", "/api/v1/runs?limit=5"]
            before = await asyncio.gather(*(client.get(p) for p in paths * 4))
            with app.state.engine.connect() as admin:
                ended = admin.scalar(
                    text(
                        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
                        " WHERE datname = current_database() AND pid <> pg_backend_pid()"
                    )
                )
            assert ended, "the reads kept no connection open"
            after = await asyncio.gather(*(client.get(p) for p in paths * 4))
        assert [a.status_code for a in after] == [200] * len(after)
        assert [a.json() for a in after] == [b.json() for b in before]

    try:
        asyncio.run(main())
    finally:
        app.state.engine.dispose()
