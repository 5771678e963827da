"""`GET /api/v1/runs` by cursor on a real server (SQLite and PostgreSQL), the `repro status`
listing that follows cursors, and the bound on a revoked token remembered elsewhere."""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.cli_runner import repro
from tests.integration.jobs import REPO
from tests.integration.service_procs import Service

SEED001 = (REPO / "examples" / "seed001.yaml").read_text()
RUNS = 40


@pytest.fixture(params=["sqlite", "postgresql"])
def service(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Service]:
    url = request.getfixturevalue("postgres_url") if request.param == "postgresql" else None
    served = Service(tmp_path / "data", database_url=url, extra=("--no-demo",))
    try:
        served.wait_ready()
        yield served
    finally:
        served.stop()


def _submit(service: Service, count: int) -> list[int]:
    ids = []
    for _ in range(count):
        created = service.submit(SEED001)
        assert created.status_code == 201, created.text
        ids.append(created.json()["run"]["id"])
    return ids


def _page(client: httpx.Client, **params: Any) -> dict[str, Any]:
    response = client.get("/api/v1/runs", params=params)
    assert response.status_code == 200, response.text
    page: dict[str, Any] = response.json()
    return page


def test_cursor_pages_hold_every_run_once_newest_first_while_runs_are_added(
    service: Service,
) -> None:
    existing = _submit(service, RUNS)
    seen: list[int] = []
    added: list[int] = []
    cursor: str | None = None
    pages = 0
    while True:
        page = _page(service.client, limit=7, **({"cursor": cursor} if cursor else {}))
        seen += [run["id"] for run in page["items"]]
        assert page["total"] is None  # not counted unless asked
        pages += 1
        cursor = page["next_cursor"]
        if cursor is None:
            break
        added += _submit(service, 2)  # new runs arrive between the pages a client reads
        assert pages <= RUNS, "the cursor does not advance"
    assert seen == sorted(existing, reverse=True)
    assert pages == -(-RUNS // 7)
    # The runs added meanwhile are on the first page of a fresh listing.
    fresh = _page(service.client, limit=len(added))
    assert [run["id"] for run in fresh["items"]] == sorted(added, reverse=True)


def test_cursor_pages_keep_the_filters_and_offset_and_count_still_work(service: Service) -> None:
    ids = _submit(service, 12)
    cancelled = ids[1::3]
    for run_id in cancelled:
        assert service.client.post(f"/api/v1/runs/{run_id}/cancel").status_code == 200
    first = _page(service.client, status="cancelled", limit=2)
    second = _page(service.client, status="cancelled", limit=2, cursor=first["next_cursor"])
    assert second["next_cursor"] is None
    listed = [r["id"] for r in first["items"] + second["items"]]
    assert listed == sorted(cancelled, reverse=True)
    assert all(r["status"] == "cancelled" for r in first["items"] + second["items"])

    unjudged = _page(service.client, verdict="none", count="true")
    assert [r["id"] for r in unjudged["items"]] == sorted(ids, reverse=True)
    assert unjudged["total"] == 12
    assert _page(service.client, verdict="reference")["items"] == []  # none succeeded yet

    counted = _page(service.client, limit=5, offset=3, count="true")
    assert counted["total"] == 12
    assert [r["id"] for r in counted["items"]] == sorted(ids, reverse=True)[3:8]
    # An offset counts from the cursor when both are given.
    after = _page(service.client, limit=2, offset=1, cursor=counted["next_cursor"])
    assert [r["id"] for r in after["items"]] == sorted(ids, reverse=True)[9:11]


def _b64(text: str) -> str:
    return base64.urlsafe_b64encode(text.encode()).decode().rstrip("=")


FOREIGN_CURSORS = [
    "nope!",
    "bm9wZQ",  # "nope"
    _b64("before:abc"),
    _b64("before:0"),
    _b64("before:-5"),
    _b64("before:99999999999"),
    _b64("after:5"),
    "A" * 41,
    "",
]


def test_a_cursor_this_server_did_not_issue_is_refused_with_422(service: Service) -> None:
    for cursor in FOREIGN_CURSORS:
        response = service.client.get("/api/v1/runs", params={"cursor": cursor})
        assert response.status_code == 422, (cursor, response.text)
        assert [p["loc"] for p in response.json()["errors"]] == ["query.cursor"], cursor


def test_repro_status_follows_cursors_past_one_page(service: Service) -> None:
    ids = _submit(service, 9)
    env = {"REPRO_TOKEN": service.admin_token}

    def listing(limit: int) -> dict[str, Any]:
        args = ["status", "--api", service.url, "--json", "--limit", str(limit)]
        done = repro(*args, env=env, timeout=120)
        assert done.returncode == 0, done.stderr
        listed: dict[str, Any] = json.loads(done.stdout)
        return listed

    everything = listing(0)
    assert [r["id"] for r in everything["items"]] == sorted(ids, reverse=True)
    assert everything["next_cursor"] is None
    some = listing(4)
    assert [r["id"] for r in some["items"]] == sorted(ids, reverse=True)[:4]
    assert some["next_cursor"] is not None


def test_a_token_revoked_on_another_api_process_stops_working_within_the_cache_lifetime(
    tmp_path: Path,
) -> None:
    lifetime = 1.0
    database = f"sqlite:///{tmp_path / 'shared.db'}"
    first = Service(tmp_path / "a", database_url=database, extra=("--no-demo",))
    second = None
    try:
        first.wait_ready()
        created = first.client.post("/api/v1/tokens", json={"name": "v", "role": "viewer"})
        token = created.json()
        # A second API process on the same database, as replicas behind a load balancer.
        second = Service(
            tmp_path / "b",
            database_url=database,
            extra=("--no-demo",),
            env={"REPRO_TOKEN_CACHE_SECONDS": str(lifetime)},
        )
        (tmp_path / "b").mkdir(parents=True, exist_ok=True)
        (tmp_path / "b" / "admin-token").write_text(first.admin_token)
        second.wait_ready()
        headers = {"Authorization": f"Bearer {token['token']}"}
        with httpx.Client(base_url=second.url, headers=headers, timeout=30) as on_second:
            assert on_second.get("/api/v1/runs").status_code == 200  # now remembered there
            revoked = first.client.post(f"/api/v1/tokens/{token['id']}/revoke")
            assert revoked.status_code == 200
            # The revoking process refuses it at once ...
            assert first.client.get("/api/v1/runs", headers=headers).status_code == 401
            # ... and the other one once its memory of the token is older than the lifetime.
            time.sleep(lifetime + 0.2)
            assert on_second.get("/api/v1/runs").status_code == 401
    finally:
        first.stop()
        if second is not None:
            second.stop()
