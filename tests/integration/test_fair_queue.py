"""Claims are fair across submitters: one submitter's 500 queued runs do not hold back
another's 5, which start within the next few claims; an admin's priority goes first; only
an admin sets one. On SQLite and PostgreSQL, through the HTTP routes."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import httpx

from service.auth.tokens import Role
from service.config import Settings
from tests.integration.asgi_clients import Clients, with_clients
from tests.integration.jobs import REPO

SEED001 = (REPO / "examples" / "seed001.yaml").read_text()
SWEEP = 500
FEW = 5


def scenario(settings: Settings, body: Callable[[Clients], Awaitable[None]]) -> None:
    """Run `body` with clients for two submitters (`sweeper`, `other`), an admin and a
    worker."""
    roles: dict[str, Role] = {
        "sweeper": "submitter",
        "other": "submitter",
        "admin": "admin",
        "worker": "worker",
    }
    with_clients(settings, roles, lambda app, clients: body(clients))


async def submit(client: httpx.AsyncClient, **params: Any) -> httpx.Response:
    return await client.post(
        "/api/v1/experiments",
        content=SEED001,
        headers={"Content-Type": "application/yaml"},
        params=params,
    )


async def queue(client: httpx.AsyncClient, count: int) -> list[int]:
    ids = []
    for _ in range(count):
        got = await submit(client)
        assert got.status_code == 201, got.text
        ids.append(got.json()["run"]["id"])
    return ids


async def claimer(worker: httpx.AsyncClient) -> Callable[[], Awaitable[int]]:
    registered = await worker.post("/api/v1/workers/register", json={"name": "w"})
    assert registered.status_code == 201, registered.text
    path = f"/api/v1/workers/{registered.json()['id']}/claim"

    async def claim() -> int:
        got = await worker.post(path)
        assert got.status_code == 200, got.text
        return int(got.json()["run"]["id"])

    return claim


def test_another_submitter_s_few_runs_start_within_the_next_claims(
    migrated_settings: Settings,
) -> None:
    async def body(clients: Clients) -> None:
        sweep = await queue(clients["sweeper"], SWEEP)
        few = await queue(clients["other"], FEW)
        claim = await claimer(clients["worker"])
        claimed = [await claim() for _ in range(2 * FEW)]
        # Turns alternate between the two submitters, each taking its own oldest run first.
        assert claimed[1::2] == few
        assert claimed[0::2] == sweep[:FEW]
        # With the other submitter's queue empty, the sweep has every claim to itself.
        assert [await claim() for _ in range(3)] == sweep[FEW : FEW + 3]

    scenario(migrated_settings, body)


def test_an_admin_s_priority_goes_first_and_only_an_admin_sets_one(
    migrated_settings: Settings,
) -> None:
    async def body(clients: Clients) -> None:
        refused = await submit(clients["sweeper"], priority=5)
        assert refused.status_code == 403, refused.text
        assert "admin" in refused.json()["detail"]
        sweep = await queue(clients["sweeper"], 3)
        urgent = await submit(clients["admin"], priority=5)
        assert urgent.status_code == 201, urgent.text
        assert urgent.json()["run"]["priority"] == 5
        rerun = await clients["sweeper"].post(
            f"/api/v1/runs/{sweep[0]}/rerun", params={"priority": 1}
        )
        assert rerun.status_code == 403, rerun.text
        boosted = await clients["admin"].post(
            f"/api/v1/runs/{sweep[1]}/rerun", params={"priority": 1}
        )
        assert boosted.status_code == 202, boosted.text
        claim = await claimer(clients["worker"])
        assert [await claim() for _ in range(3)] == [
            urgent.json()["run"]["id"],
            boosted.json()["id"],
            sweep[0],
        ]

    scenario(migrated_settings, body)
