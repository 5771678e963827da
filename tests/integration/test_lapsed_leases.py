"""A worker that trained on while the API was away keeps its run: a lapsed lease is renewed,
and a run requeued meanwhile is taken back on the same attempt, as long as no other worker
has claimed it. Once another has, the old holder's heartbeats, uploads and reports are
refused and only the new holder's report counts; a report about an attempt that is over is
refused too. A freshly started API requeues nothing for its grace period. On SQLite and
PostgreSQL, through the HTTP routes."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any

import httpx
from sqlalchemy import update

from service.config import Settings
from service.persistence.models import Run, utcnow
from service.runs import queue
from tests.integration.asgi_clients import Clients, with_clients
from tests.integration.jobs import REPO

SEED001 = (REPO / "examples" / "seed001.yaml").read_text()


class Fleet:
    """A submitter's client and two workers, `a` and `b`, registered under one worker token."""

    def __init__(self, app: Any, submitter: httpx.AsyncClient, worker: httpx.AsyncClient) -> None:
        self.app, self.submitter, self.worker = app, submitter, worker
        self.ids: dict[str, int] = {}

    async def register(self) -> None:
        for name in ("a", "b"):
            got = await self.worker.post("/api/v1/workers/register", json={"name": name})
            assert got.status_code == 201, got.text
            self.ids[name] = got.json()["id"]

    async def submit(self) -> int:
        got = await self.submitter.post(
            "/api/v1/experiments", content=SEED001, headers={"Content-Type": "application/yaml"}
        )
        assert got.status_code == 201, got.text
        return int(got.json()["run"]["id"])

    async def claim(self, name: str) -> httpx.Response:
        return await self.worker.post(f"/api/v1/workers/{self.ids[name]}/claim")

    async def heartbeat(self, run_id: int, name: str, attempt: int) -> httpx.Response:
        body = {"worker_id": self.ids[name], "attempt": attempt, "progress": None}
        return await self.worker.post(f"/api/v1/runs/{run_id}/heartbeat", json=body)

    async def fail(self, run_id: int, name: str, attempt: int) -> httpx.Response:
        error = {"type": "Test", "message": f"reported by {name} on attempt {attempt}"}
        body = {"worker_id": self.ids[name], "attempt": attempt, "error": error}
        return await self.worker.post(f"/api/v1/runs/{run_id}/fail", json=body)

    async def upload(self, run_id: int, name: str, attempt: int) -> httpx.Response:
        data = b"not a real checkpoint"
        params = {
            "worker_id": self.ids[name],
            "attempt": attempt,
            "kind": "checkpoint",
            "name": "epoch-000001.npz",
            "epoch": 1,
        }
        headers = {
            "Content-Type": "application/octet-stream",
            "X-Content-SHA256": hashlib.sha256(data).hexdigest(),
        }
        return await self.worker.post(
            f"/api/v1/runs/{run_id}/artifacts", params=params, headers=headers, content=data
        )

    async def run(self, run_id: int) -> dict[str, Any]:
        got = await self.submitter.get(f"/api/v1/runs/{run_id}")
        assert got.status_code == 200, got.text
        return dict(got.json())

    def lapse(self) -> None:
        """Every lease ran out a second ago: the workers went quiet (or the API was away)."""
        with self.app.state.sessionmaker() as db:
            db.execute(update(Run).values(lease_expires_at=utcnow() - timedelta(seconds=1)))
            db.commit()

    def requeue(self) -> None:
        """What the next claim of any worker does first: lapsed runs go back to the queue."""
        with self.app.state.sessionmaker() as db:
            queue.requeue_expired(db=db, settings=self.app.state.settings)


def scenario(settings: Settings, body: Callable[[Fleet], Awaitable[None]]) -> None:
    async def run(app: Any, clients: Clients) -> None:
        fleet = Fleet(app, clients["submitter"], clients["worker"])
        await fleet.register()
        await body(fleet)

    with_clients(settings, {"submitter": "submitter", "worker": "worker"}, run)


def no_grace(settings: Settings) -> Settings:
    return settings.model_copy(update={"lease_grace_seconds": 0.0})


def test_the_holder_takes_its_requeued_run_back_until_another_worker_claims_it(
    migrated_settings: Settings,
) -> None:
    async def body(fleet: Fleet) -> None:
        run_id = await fleet.submit()
        claimed = await fleet.claim("a")
        assert claimed.status_code == 200 and claimed.json()["run"]["attempt"] == 1

        # The lease lapsed but nobody requeued the run: the holder simply renews it.
        fleet.lapse()
        assert (await fleet.heartbeat(run_id, "a", 1)).status_code == 200
        # Requeued while the holder was away: its next heartbeat takes the run back, on the
        # same attempt, with a fresh lease.
        fleet.lapse()
        fleet.requeue()
        assert (await fleet.run(run_id))["status"] == "queued"
        assert (await fleet.heartbeat(run_id, "a", 1)).status_code == 200
        back = await fleet.run(run_id)
        assert (back["status"], back["attempt"], back["worker_id"]) == (
            "running",
            1,
            fleet.ids["a"],
        )
        # ... which nobody else can claim now.
        assert (await fleet.claim("b")).status_code == 204

        # Requeued again, and this time another worker claims it first: a second attempt.
        fleet.lapse()
        second = await fleet.claim("b")
        assert second.status_code == 200, second.text
        assert second.json()["run"]["id"] == run_id and second.json()["run"]["attempt"] == 2
        # The old holder comes back: every heartbeat, upload and report is refused.
        for refused in (
            await fleet.heartbeat(run_id, "a", 1),
            await fleet.upload(run_id, "a", 1),
            await fleet.fail(run_id, "a", 1),
        ):
            assert refused.status_code == 403, refused.text
            assert "held by another worker" in refused.text
        # The new holder's report about an attempt that is not its own is refused as well.
        stale = await fleet.heartbeat(run_id, "b", 1)
        assert stale.status_code == 409 and "attempt 1" in stale.text, stale.text
        finished = await fleet.fail(run_id, "b", 2)
        assert finished.status_code == 200, finished.text
        done = await fleet.run(run_id)
        assert done["status"] == "failed" and done["error"]["message"] == (
            "reported by b on attempt 2"
        )
        # Finished: the first holder's late report still changes nothing.
        assert (await fleet.fail(run_id, "a", 1)).status_code == 409
        assert (await fleet.run(run_id))["error"] == done["error"]

    scenario(no_grace(migrated_settings), body)


def test_a_released_run_is_not_taken_back_by_the_holder_whose_lease_lapsed(
    migrated_settings: Settings,
) -> None:
    async def body(fleet: Fleet) -> None:
        run_id = await fleet.submit()
        assert (await fleet.claim("a")).status_code == 200
        fleet.lapse()
        second = await fleet.claim("b")  # requeued and claimed by b (attempt 2) ...
        assert second.json()["run"]["attempt"] == 2
        release = {"worker_id": fleet.ids["b"], "attempt": 2, "reason": "shutting down"}
        released = await fleet.worker.post(f"/api/v1/runs/{run_id}/release", json=release)
        assert released.status_code == 200, released.text
        # ... which gave it back: attempt 1 is the run's count again, but not a's to resume.
        assert (await fleet.run(run_id))["attempt"] == 1
        assert (await fleet.heartbeat(run_id, "a", 1)).status_code == 409
        assert (await fleet.run(run_id))["status"] == "queued"

    scenario(no_grace(migrated_settings), body)


def test_a_starting_api_requeues_nothing_for_its_grace_period(
    migrated_settings: Settings,
) -> None:
    async def body(fleet: Fleet) -> None:
        run_id = await fleet.submit()
        assert (await fleet.claim("a")).status_code == 200
        fleet.lapse()  # the API was away longer than the lease, and has just started
        assert (await fleet.claim("b")).status_code == 204
        held = await fleet.run(run_id)
        assert (held["status"], held["worker_id"]) == ("running", fleet.ids["a"])
        assert (await fleet.heartbeat(run_id, "a", 1)).status_code == 200

        fleet.lapse()
        fleet.app.state.requeue_from = time.monotonic()  # the grace period is over
        taken = await fleet.claim("b")
        assert taken.status_code == 200 and taken.json()["run"]["attempt"] == 2

    grace = migrated_settings.model_copy(update={"lease_grace_seconds": 600.0})
    scenario(grace, body)
