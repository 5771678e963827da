"""Image identity as provenance on the API side: a rerun pins the image its original ran (by
image ID first), and a run pinned to an image no live worker has says why it waits."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx

from service.app import create_app
from service.auth.tokens import create_token
from service.config import Settings
from service.persistence.migrate import upgrade
from service.persistence.models import Run
from tests.integration.jobs import REPO

SEED001 = (REPO / "examples" / "seed001.yaml").read_text()
IMAGE_ID = "sha256:" + "cd" * 32
Scenario = Callable[[Any, httpx.AsyncClient, httpx.AsyncClient], Awaitable[None]]


def scenario(tmp_path: Path, body: Scenario) -> None:
    """Run `body(app, admin, worker)` against the app on a fresh SQLite database."""
    settings = Settings(data_dir=tmp_path / "data", lease_seconds=30)
    upgrade(settings.resolved_database_url)
    app = create_app(settings)
    with app.state.sessionmaker() as db:
        secrets = {
            role: create_token(db=db, name=role, role=role)[1] for role in ("admin", "worker")
        }

    async def main() -> None:
        transport = httpx.ASGITransport(app=app)
        admin, worker = (
            httpx.AsyncClient(
                transport=transport,
                base_url="http://api",
                headers={"Authorization": f"Bearer {secrets[role]}"},
            )
            for role in ("admin", "worker")
        )
        try:
            await body(app, admin, worker)
        finally:
            await admin.aclose()
            await worker.aclose()

    try:
        asyncio.run(main())
    finally:
        app.state.engine.dispose()


async def submit(client: httpx.AsyncClient, spec: str) -> dict[str, Any]:
    created = await client.post(
        "/api/v1/experiments", content=spec, headers={"content-type": "application/yaml"}
    )
    assert created.status_code == 201, created.text
    run: dict[str, Any] = created.json()["run"]
    return run


def test_a_run_pinned_to_an_image_no_live_worker_has_says_why_it_waits(tmp_path: Path) -> None:
    async def body(app: Any, admin: httpx.AsyncClient, worker: httpx.AsyncClient) -> None:
        run = await submit(admin, SEED001 + f"environment: {{image: '{IMAGE_ID}'}}\n")
        unpinned = await submit(admin, SEED001.replace("seed: 42", "seed: 43"))
        other = {"name": "other", "images": ["sha256:" + "ef" * 32]}
        assert (await worker.post("/api/v1/workers/register", json=other)).status_code == 201

        detail = (await admin.get(f"/api/v1/runs/{run['id']}")).json()
        assert detail["status"] == "queued"
        assert IMAGE_ID in detail["waiting_reason"]
        assert (await admin.get(f"/api/v1/runs/{unpinned['id']}")).json()["waiting_reason"] is None

        capable = {"name": "capable", "images": [IMAGE_ID]}
        assert (await worker.post("/api/v1/workers/register", json=capable)).status_code == 201
        assert (await admin.get(f"/api/v1/runs/{run['id']}")).json()["waiting_reason"] is None

    scenario(tmp_path, body)


def test_a_rerun_pins_the_image_id_its_original_recorded(tmp_path: Path) -> None:
    async def body(app: Any, admin: httpx.AsyncClient, worker: httpx.AsyncClient) -> None:
        # Pinned by tag at submission; the worker recorded what that tag was when it ran.
        tag = "reprotrain-worker-cpu:0.1.0"
        original = await submit(admin, SEED001 + f"environment: {{image: '{tag}'}}\n")
        with app.state.sessionmaker() as db:
            run = db.get_one(Run, original["id"])
            run.status = "succeeded"
            run.provenance = {
                "image": {"id": IMAGE_ID, "repo_digests": [], "digest": None, "reference": tag}
            }
            db.commit()
        rerun = await admin.post(f"/api/v1/runs/{original['id']}/rerun")
        assert rerun.status_code == 202, rerun.text
        assert rerun.json()["required_image"] == IMAGE_ID

    scenario(tmp_path, body)
