"""Worker identity at fleet scale: 1,000 workers enroll with one bootstrap token and each
gets a credential of its own, with which it works; revoking one worker's credential stops
that worker alone; the bootstrap token rotates while enrolled workers keep working; a name
whose credential is live cannot be enrolled again. On SQLite and PostgreSQL, through the
HTTP routes."""

from __future__ import annotations

from typing import Any

import httpx

from service.config import Settings
from tests.integration.asgi_clients import Clients, same_app, with_clients

FLEET = 1000


async def enroll(bootstrap: httpx.AsyncClient, name: str) -> httpx.Response:
    return await bootstrap.post("/api/v1/workers/enroll", json={"name": name})


def test_a_thousand_workers_enroll_and_each_credential_is_its_own(
    migrated_settings: Settings,
) -> None:
    async def body(app: Any, clients: Clients) -> None:
        admin, bootstrap = clients["admin"], clients["bootstrap"]
        enrolled = []
        for i in range(FLEET):
            got = await enroll(bootstrap, f"node-{i:04d}")
            assert got.status_code == 201, got.text
            enrolled.append(got.json())
        assert len({e["credential_id"] for e in enrolled}) == FLEET
        assert len({e["id"] for e in enrolled}) == FLEET

        workers = [same_app(admin, e["credential"]) for e in enrolled]
        try:
            # Every worker works with its own credential (a claim with nothing queued: 204).
            for worker, e in zip(workers, enrolled, strict=True):
                claimed = await worker.post(f"/api/v1/workers/{e['id']}/claim")
                assert claimed.status_code == 204, claimed.text
            # ... and only as itself: another worker's id is another identity's.
            other = await workers[0].post(f"/api/v1/workers/{enrolled[1]['id']}/claim")
            assert other.status_code == 403, other.text

            # One compromised worker: its credential is revoked, it alone stops.
            revoked = await admin.post(f"/api/v1/tokens/{enrolled[7]['credential_id']}/revoke")
            assert revoked.status_code == 200, revoked.text
            stopped = await workers[7].post(f"/api/v1/workers/{enrolled[7]['id']}/claim")
            assert stopped.status_code == 401, stopped.text
            for i in (6, 8):
                going = await workers[i].post(f"/api/v1/workers/{enrolled[i]['id']}/claim")
                assert going.status_code == 204, going.text

            # A live credential's name is not enrolled again; a revoked one's is, as the
            # same worker with a new credential.
            taken = await enroll(bootstrap, "node-0003")
            assert taken.status_code == 409 and "revoke" in taken.json()["detail"], taken.text
            again = await enroll(bootstrap, "node-0007")
            assert again.status_code == 201, again.text
            assert again.json()["id"] == enrolled[7]["id"]
            assert again.json()["credential_id"] != enrolled[7]["credential_id"]

            # The fleet's bootstrap token rotates: a new one, the old one revoked.
            created = await admin.post("/api/v1/tokens", json={"name": "boot-2", "role": "worker"})
            assert created.status_code == 201, created.text
            old_id = int(bootstrap.headers["Authorization"].split("_")[1])
            assert (await admin.post(f"/api/v1/tokens/{old_id}/revoke")).status_code == 200
            assert (await enroll(bootstrap, "node-late")).status_code == 401
            async with same_app(admin, created.json()["token"]) as fresh:
                assert (await enroll(fresh, "node-late")).status_code == 201
            # Enrolled workers did not notice.
            for i in (0, FLEET // 2, FLEET - 1):
                going = await workers[i].post(f"/api/v1/workers/{enrolled[i]['id']}/claim")
                assert going.status_code == 204, going.text
        finally:
            for worker in workers:
                await worker.aclose()

    with_clients(migrated_settings, {"admin": "admin", "bootstrap": "worker"}, body)


def test_a_bootstrap_token_enrolls_at_most_its_limit_of_live_workers(
    migrated_settings: Settings,
) -> None:
    async def body(app: Any, clients: Clients) -> None:
        admin, bootstrap = clients["admin"], clients["bootstrap"]
        first = [await enroll(bootstrap, f"n{i}") for i in range(3)]
        assert [r.status_code for r in first] == [201, 201, 201]
        refused = await enroll(bootstrap, "n3")
        assert refused.status_code == 409, refused.text
        assert "REPRO_MAX_ENROLLMENTS_PER_TOKEN=3" in refused.json()["detail"]
        # A credential revoked frees its place.
        gone = first[0].json()["credential_id"]
        assert (await admin.post(f"/api/v1/tokens/{gone}/revoke")).status_code == 200
        assert (await enroll(bootstrap, "n3")).status_code == 201

    limited = migrated_settings.model_copy(update={"max_enrollments_per_token": 3})
    with_clients(limited, {"admin": "admin", "bootstrap": "worker"}, body)
