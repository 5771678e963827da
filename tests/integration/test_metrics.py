"""`/metrics` and `GET /api/v1/queue/stats` report what the queue really holds, on SQLite
and PostgreSQL, after runs were submitted, claimed, cancelled and let go by their worker."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import update

from service.app import create_app
from service.auth.tokens import create_token
from service.config import Settings
from service.persistence.migrate import upgrade
from service.persistence.models import Run, Verdict, utcnow
from tests.integration.jobs import REPO

SEED001 = (REPO / "examples" / "seed001.yaml").read_text()
Clients = dict[str, httpx.AsyncClient]


@pytest.fixture
def settings(migrated_settings: Settings) -> Settings:
    return migrated_settings


def scenario(settings: Settings, body: Callable[[Any, Clients], Awaitable[None]]) -> None:
    """Run `body(app, clients)` with a client per role and one without a token."""
    app = create_app(settings)
    with app.state.sessionmaker() as db:
        secrets = {
            role: create_token(db=db, name=role, role=role)[1]
            for role in ("submitter", "worker", "viewer")
        }

    async def main() -> None:
        transport = httpx.ASGITransport(app=app)
        clients = {
            role: httpx.AsyncClient(
                transport=transport,
                base_url="http://api",
                headers={"Authorization": f"Bearer {secret}"} if secret else {},
            )
            for role, secret in {**secrets, "anonymous": ""}.items()
        }
        try:
            await body(app, clients)
        finally:
            for client in clients.values():
                await client.aclose()

    try:
        asyncio.run(main())
    finally:
        app.state.engine.dispose()


async def scrape(client: httpx.AsyncClient) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of `/metrics`, by name and labels."""
    got = await client.get("/metrics")
    assert got.status_code == 200, got.text
    assert got.headers["content-type"].startswith("text/plain")
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(got.text)
        for sample in family.samples
    }


async def submit(client: httpx.AsyncClient, count: int) -> list[int]:
    ids = []
    for _ in range(count):
        got = await client.post(
            "/api/v1/experiments", content=SEED001, headers={"Content-Type": "application/yaml"}
        )
        assert got.status_code == 201, got.text
        ids.append(got.json()["run"]["id"])
    return ids


def test_metrics_count_runs_verdicts_workers_claims_and_requests(settings: Settings) -> None:
    async def body(app: Any, clients: Clients) -> None:
        before = await scrape(clients["anonymous"])  # process-wide series: compare deltas
        run_ids = await submit(clients["submitter"], 4)
        worker = await clients["worker"].post("/api/v1/workers/register", json={"name": "w"})
        claim_path = f"/api/v1/workers/{worker.json()['id']}/claim"
        claimed = await clients["worker"].post(claim_path)
        assert claimed.status_code == 200 and claimed.json()["run"]["id"] == run_ids[0]
        assert (await clients["submitter"].post(f"/api/v1/runs/{run_ids[3]}/cancel")).is_success
        assert (await clients["viewer"].get(f"/api/v1/runs/{run_ids[1]}")).status_code == 200
        assert (await clients["viewer"].get("/no/such/page/42")).status_code == 404
        with app.state.sessionmaker() as db:  # a rerun's verdict, as the comparison stores it
            db.add(
                Verdict(
                    run_id=run_ids[2], reference_run_id=run_ids[1], verdict="diverged", report={}
                )
            )
            db.commit()

        after = await scrape(clients["anonymous"])
        assert after[("reprotrain_runs", (("status", "queued"),))] == 2
        assert after[("reprotrain_runs", (("status", "running"),))] == 1
        assert after[("reprotrain_runs_finished_total", (("outcome", "cancelled"),))] == 1
        assert after[("reprotrain_runs_finished_total", (("outcome", "succeeded"),))] == 0
        assert after[("reprotrain_verdicts_total", (("verdict", "diverged"),))] == 1
        assert after[("reprotrain_verdicts_total", (("verdict", "identical"),))] == 0
        assert after[("reprotrain_workers_live", ())] == 1

        def delta(name: str, labels: tuple[tuple[str, str], ...]) -> float:
            return after[(name, labels)] - before.get((name, labels), 0.0)

        assert delta("reprotrain_claim_seconds_count", (("outcome", "claimed"),)) == 1
        run_route = (
            ("method", "GET"),
            ("route", "/api/v1/runs/{run_id}"),
            ("status", "200"),
        )
        assert delta("reprotrain_http_request_duration_seconds_count", run_route) == 1
        unmatched = (("method", "GET"), ("route", "<unmatched>"), ("status", "404"))
        assert delta("reprotrain_http_request_duration_seconds_count", unmatched) == 1
        # Raw paths never become labels (one series per id would grow without bound).
        assert not any(f"/runs/{run_ids[1]}" in str(labels) for _, labels in after)
        assert after[("reprotrain_event_streams_open", ())] == 0
        assert after[("reprotrain_claims_waiting", ())] == 0

    scenario(settings, body)


def test_an_expired_lease_is_counted_when_its_run_is_requeued(settings: Settings) -> None:
    async def body(app: Any, clients: Clients) -> None:
        await submit(clients["submitter"], 1)
        worker = await clients["worker"].post("/api/v1/workers/register", json={"name": "w"})
        claim_path = f"/api/v1/workers/{worker.json()['id']}/claim"
        assert (await clients["worker"].post(claim_path)).status_code == 200
        before = await scrape(clients["anonymous"])
        with app.state.sessionmaker() as db:  # the worker went silent a lease ago
            db.execute(update(Run).values(lease_expires_at=utcnow() - timedelta(seconds=1)))
            db.commit()
        again = await clients["worker"].post(claim_path)  # requeues it, then takes it again
        assert again.status_code == 200 and again.json()["run"]["attempt"] == 2
        after = await scrape(clients["anonymous"])
        expiries = ("reprotrain_lease_expiries_total", ())
        assert after[expiries] - before[expiries] == 1

    # A started API leaves lapsed leases alone for a grace period: none here.
    scenario(settings.model_copy(update={"lease_grace_seconds": 0.0}), body)


def test_queue_stats_split_queued_and_running_runs_by_what_they_require(
    settings: Settings,
) -> None:
    async def body(app: Any, clients: Clients) -> None:
        run_ids = await submit(clients["submitter"], 5)
        with app.state.sessionmaker() as db:  # pinned reruns, as rerun and refine make them
            db.execute(
                update(Run).where(Run.id.in_(run_ids[3:])).values(required_image="sha256:abc")
            )
            db.execute(update(Run).where(Run.id == run_ids[2]).values(required_worker="gpu-1"))
            db.commit()
        worker = await clients["worker"].post("/api/v1/workers/register", json={"name": "w"})
        claimed = await clients["worker"].post(f"/api/v1/workers/{worker.json()['id']}/claim")
        assert claimed.json()["run"]["id"] == run_ids[0]

        for role in ("viewer", "worker", "submitter"):
            got = await clients[role].get("/api/v1/queue/stats")
            assert got.status_code == 200, got.text
            assert got.json() == {
                "queued": 4,
                "running": 1,
                "by_requirement": [
                    {"required_image": None, "required_worker": None, "queued": 1, "running": 1},
                    {"required_image": None, "required_worker": "gpu-1", "queued": 1, "running": 0},
                    {
                        "required_image": "sha256:abc",
                        "required_worker": None,
                        "queued": 2,
                        "running": 0,
                    },
                ],
            }
        assert (await clients["anonymous"].get("/api/v1/queue/stats")).status_code == 401

    scenario(settings, body)


def test_metrics_can_require_a_token_with_the_read_role(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path / "data", metrics_token_required=True)
    upgrade(settings.resolved_database_url)

    async def body(app: Any, clients: Clients) -> None:
        assert (await clients["anonymous"].get("/metrics")).status_code == 401
        assert (await clients["worker"].get("/metrics")).status_code == 403
        got = await clients["viewer"].get("/metrics")
        assert got.status_code == 200 and "reprotrain_runs" in got.text

    scenario(settings, body)
