"""Who may replay a spot check's segments, against the real API on each database: a worker
is known by the credential it authenticated with (its worker token), not by the name or the
hostname it declares, so a token that trained a run cannot replay it under a second name;
the trainer replays only when the request says so, and a check no other identity could take
ends saying so instead of falling back to the trainer; a replay needs the image the run
recorded; and a run holds a bounded number of outstanding spot checks.

The trained run is stored as completion stores it (no model is trained): what is tested is
who can claim its replays, and what the spot check then says."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import httpx

from service.auth.tokens import Role
from service.config import Settings
from service.persistence.models import Artifact, Run, Worker, utcnow
from tests.integration.asgi_clients import Clients, with_clients
from tests.integration.jobs import blobs_spec

IMAGE = "sha256:" + "ab" * 32  # the image the run recorded training on
OTHER_IMAGE = "sha256:" + "cd" * 32
EPOCHS = 3
TOKENS = ("admin", "trainer", "other")


@dataclass
class World:
    app: Any
    clients: dict[str, httpx.AsyncClient]  # an admin, the trainer's token, another token

    async def register(self, token: str, name: str, **fields: Any) -> int:
        """A worker registered under `token`, by name, hostname and images it declares."""
        body = {"name": name, "hostname": name, **fields}
        answer = await self.clients[token].post("/api/v1/workers/register", json=body)
        assert answer.status_code == 201, answer.text
        return int(answer.json()["id"])

    async def claim(self, token: str, worker_id: int) -> int | None:
        """The run id the worker claimed, or None (nothing it may run)."""
        answer = await self.clients[token].post(f"/api/v1/workers/{worker_id}/claim")
        assert answer.status_code in (200, 204), answer.text
        return int(answer.json()["run"]["id"]) if answer.status_code == 200 else None

    async def spot_check(self, run_id: int, **body: Any) -> httpx.Response:
        return await self.clients["admin"].post(
            f"/api/v1/runs/{run_id}/spot-checks", json={"segments": 1, **body}
        )

    async def check(self, check_id: int) -> dict[str, Any]:
        found = await self.clients["admin"].get(f"/api/v1/spot-checks/{check_id}")
        assert found.status_code == 200, found.text
        doc: dict[str, Any] = found.json()
        return doc

    async def trained_run(
        self, trainer_id: int, *, image: str | None = IMAGE, pinned: str | None = None
    ) -> int:
        """A training of EPOCHS epochs claimed by the trainer and stored as succeeded, with its
        epoch checkpoints kept, as completion stores it; `image`: what it recorded running
        on, `pinned`: what its spec pinned."""
        spec = blobs_spec(training={**blobs_spec()["training"], "epochs": EPOCHS})
        if pinned is not None:
            spec["environment"] = {"image": pinned}
        created = await self.clients["admin"].post("/api/v1/experiments", json=spec)
        assert created.status_code == 201, created.text
        run_id = int(created.json()["run"]["id"])
        with self.app.state.sessionmaker() as db:
            run = db.get_one(Run, run_id)
            run.status, run.worker_id, run.attempt = "succeeded", trainer_id, 1
            run.started_at = run.finished_at = utcnow()
            run.provenance = {"image": {"id": image, "digest": None, "reference": pinned}}
            for epoch in range(1, EPOCHS + 1):
                for ext in ("npz", "json"):
                    db.add(
                        Artifact(
                            run_id=run_id, kind="checkpoint", name=f"epoch-{epoch:06d}.{ext}",
                            epoch=epoch, sha256=f"{epoch:064x}", size=1,
                            storage_url=f"file:///nowhere/{epoch}.{ext}", attempt=1,
                        )
                    )  # fmt: skip
            db.commit()
        return run_id


def scenario(settings: Settings, body: Callable[[World], Awaitable[None]], **changes: Any) -> None:
    """Run `body` against the app on the migrated database, with these settings changed."""
    roles: dict[str, Role] = {n: "admin" if n == "admin" else "worker" for n in TOKENS}

    async def run(app: Any, clients: Clients) -> None:
        await body(World(app, clients))

    with_clients(settings.model_copy(update=changes), roles, run)


def test_the_trainers_token_cannot_replay_its_run_under_another_name(
    migrated_settings: Settings,
) -> None:
    async def body(world: World) -> None:
        trainer = await world.register("trainer", "trainer", images=[IMAGE])
        run_id = await world.trained_run(trainer)
        asked = await world.spot_check(run_id)
        assert asked.status_code == 202, asked.text
        [replay] = [s["run_id"] for s in asked.json()["segments"]]
        # The same token, another name and another hostname: the same identity.
        alias = await world.register("trainer", "fresh-name", images=[IMAGE])
        assert await world.claim("trainer", alias) is None
        # The wait for another worker is over: still not the trainer's to take.
        assert await world.claim("trainer", trainer) is None
        other = await world.register("other", "independent", images=[IMAGE])
        assert await world.claim("other", other) == replay
        check = await world.check(asked.json()["id"])
        assert check["status"] == "pending"

    scenario(migrated_settings, body, spot_check_other_worker_seconds=0)


def test_a_replay_needs_the_image_the_run_recorded(migrated_settings: Settings) -> None:
    async def body(world: World) -> None:
        trainer = await world.register("trainer", "trainer", images=[IMAGE])
        unpinned = await world.trained_run(trainer)
        by_tag = await world.trained_run(trainer, pinned="repro-cpu:latest")
        for run_id in (unpinned, by_tag):
            asked = await world.spot_check(run_id)
            assert asked.status_code == 202, asked.text
            replays = {s["run_id"] for s in asked.json()["segments"]}
            with world.app.state.sessionmaker() as db:
                assert {db.get_one(Run, r).required_image for r in replays} == {IMAGE}
        # Another identity advertising another image (or the tag the run was pinned by, which
        # any image can carry) takes neither; one advertising the recorded image takes both.
        elsewhere = await world.register(
            "other", "elsewhere", images=[OTHER_IMAGE, "repro-cpu:latest"]
        )
        assert await world.claim("other", elsewhere) is None
        same = await world.register("other", "same-image", images=[IMAGE])
        assert await world.claim("other", same) is not None
        assert await world.claim("other", same) is not None

    scenario(migrated_settings, body)


def test_with_only_the_trainer_live_the_check_ends_without_an_independent_worker(
    migrated_settings: Settings,
) -> None:
    async def body(world: World) -> None:
        trainer = await world.register("trainer", "trainer", images=[IMAGE])
        run_id = await world.trained_run(trainer)
        asked = await world.spot_check(run_id)
        assert asked.status_code == 202, asked.text
        assert await world.claim("trainer", trainer) is None
        # Another identity is live that could take it, busy elsewhere: the check waits.
        busy = await world.register("other", "busy", images=[IMAGE])
        assert (await world.check(asked.json()["id"]))["status"] == "pending"
        with world.app.state.sessionmaker() as db:  # it went away: no longer live
            db.get_one(Worker, busy).last_seen_at = utcnow().replace(year=2000)
            db.commit()
        ended = await world.check(asked.json()["id"])
        assert ended["status"] == "no-other-worker", ended
        report = ended["report"]
        assert "no worker of another identity" in report["explanation"]
        assert "allow_trainer" in report["explanation"]
        assert [s["status"] for s in report["segments"]] == ["cancelled"]
        listed = await world.clients["admin"].get(
            "/api/v1/runs", params={"spot_check": "no-other-worker"}
        )
        assert [r["id"] for r in listed.json()["items"]] == [run_id]
        # The trainer never gets the replay afterwards.
        assert await world.claim("trainer", trainer) is None

    scenario(migrated_settings, body, spot_check_other_worker_seconds=0)


def test_the_trainer_replays_only_when_asked_and_the_report_says_so(
    migrated_settings: Settings,
) -> None:
    async def body(world: World) -> None:
        trainer = await world.register("trainer", "trainer", images=[IMAGE])
        run_id = await world.trained_run(trainer)
        asked = await world.spot_check(run_id, allow_trainer=True)
        assert asked.status_code == 202, asked.text
        assert asked.json()["report"]["allow_trainer"] is True
        [replay] = [s["run_id"] for s in asked.json()["segments"]]
        assert await world.claim("trainer", trainer) == replay
        failed = await world.clients["trainer"].post(
            f"/api/v1/runs/{replay}/fail",
            json={"worker_id": trainer, "error": {"type": "Crashed", "message": "gone"}},
        )
        assert failed.status_code == 200, failed.text
        ended = await world.check(asked.json()["id"])
        [row] = ended["report"]["segments"]
        assert row["same_worker"] is True and row["worker"] == "trainer"
        assert ended["report"]["independent_segments"] == 0

    scenario(migrated_settings, body)


def test_outstanding_spot_checks_of_a_run_are_bounded(migrated_settings: Settings) -> None:
    async def body(world: World) -> None:
        trainer = await world.register("trainer", "trainer", images=[IMAGE])
        run_id = await world.trained_run(trainer)
        answers = await asyncio.gather(*(world.spot_check(run_id) for _ in range(12)))
        codes = sorted(a.status_code for a in answers)
        assert codes == [202] * 4 + [409] * 8, [a.text for a in answers]
        refused = next(a for a in answers if a.status_code == 409).json()
        assert "REPRO_MAX_PENDING_SPOT_CHECKS_PER_RUN" in refused["detail"]
        listed = await world.clients["admin"].get(f"/api/v1/runs/{run_id}/spot-checks")
        assert len(listed.json()) == 4
        # One ends (its replay cancelled): the run may be checked again.
        first = next(a for a in answers if a.status_code == 202).json()
        cancelled = await world.clients["admin"].post(
            f"/api/v1/runs/{first['segments'][0]['run_id']}/cancel"
        )
        assert cancelled.status_code == 200, cancelled.text
        assert (await world.spot_check(run_id)).status_code == 202

    scenario(migrated_settings, body)
