"""Worker registrations are bounded and the workers list pages, against a real `repro serve`
on SQLite and PostgreSQL: an oversized registration gets 422 naming the field and stores
nothing, a token past its worker names gets 409, and the API and the dashboard page the
workers a page at a time."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.integration.service_procs import Service

NAMES_PER_TOKEN = 3
IMAGES_PER_WORKER = 4


@pytest.fixture
def service(database_url: str | None, tmp_path: Path) -> Iterator[Service]:
    svc = Service(
        tmp_path / "data",
        database_url=database_url,
        env={
            "REPRO_MAX_WORKERS_PER_TOKEN": str(NAMES_PER_TOKEN),
            "REPRO_MAX_WORKER_IMAGES": str(IMAGES_PER_WORKER),
        },
        extra=("--no-demo",),
    )
    try:
        yield svc.wait_ready()
    finally:
        svc.stop()


def register(client: httpx.Client, name: str, **fields: Any) -> httpx.Response:
    return client.post("/api/v1/workers/register", json={"name": name, **fields})


def worker_names(service: Service) -> set[str]:
    answer = service.client.get("/api/v1/workers", params={"limit": 500})
    assert answer.status_code == 200, answer.text
    return {w["name"] for w in answer.json()}


OVERSIZED: dict[str, tuple[dict[str, Any], str]] = {
    "too many images": (
        {"images": [f"repo/image:{i}" for i in range(IMAGES_PER_WORKER + 1)]},
        "body.images",
    ),
    "a long image reference": ({"images": ["a" * 501]}, "body.images.0"),
    "a long executor name": ({"executors": ["process", "x" * 41]}, "body.executors.1"),
    "a long hostname": ({"hostname": "h" * 201}, "body.hostname"),
    "a long GPU name": ({"gpu": "g" * 201}, "body.gpu"),
    "a long worker name": ({"name": "n" * 201}, "body.name"),
}


@pytest.mark.parametrize("case", sorted(OVERSIZED))
def test_an_oversized_registration_gets_422_naming_the_field_and_stores_nothing(
    service: Service, case: str
) -> None:
    fields, loc = dict(OVERSIZED[case][0]), OVERSIZED[case][1]
    client = service.client_for("worker", "node")
    answer = register(client, fields.pop("name", "big"), **fields)
    assert answer.status_code == 422, answer.text
    assert loc in [e["loc"] for e in answer.json()["errors"]], answer.json()
    assert worker_names(service) == set()
    # The same worker within the bounds registers.
    ok = register(client, "big", images=[f"repo/image:{i}" for i in range(IMAGES_PER_WORKER)])
    assert ok.status_code == 201, ok.text
    assert worker_names(service) == {"big"}


def test_a_token_holds_a_bounded_number_of_worker_names(service: Service) -> None:
    pool = service.client_for("worker", "pool")
    ids = {}
    for i in range(NAMES_PER_TOKEN):
        answer = register(pool, f"pool-{i}")
        assert answer.status_code == 201, answer.text
        ids[f"pool-{i}"] = answer.json()["id"]
    refused = register(pool, "pool-extra")
    assert refused.status_code == 409, refused.text
    assert "REPRO_MAX_WORKERS_PER_TOKEN" in refused.json()["detail"]
    assert worker_names(service) == set(ids)
    # A name it holds registers again (a restarted agent keeps its identity).
    again = register(pool, "pool-1", images=["repo/image:2"])
    assert again.status_code == 201 and again.json()["id"] == ids["pool-1"]
    # Another token has names of its own.
    other = service.client_for("worker", "other")
    assert register(other, "other-0").status_code == 201
    assert worker_names(service) == {*ids, "other-0"}


def _pages(service: Service, limit: int) -> list[list[str]]:
    pages: list[list[str]] = []
    params: dict[str, Any] = {"limit": limit}
    while True:
        answer = service.client.get("/api/v1/workers", params=params)
        assert answer.status_code == 200, answer.text
        pages.append([w["name"] for w in answer.json()])
        cursor = answer.headers.get("x-next-cursor")
        if cursor is None:
            assert "link" not in answer.headers
            return pages
        assert answer.headers["link"].endswith('>; rel="next"')
        params = {"limit": limit, "cursor": cursor}


def test_the_workers_list_pages_in_the_api_and_the_dashboard(service: Service) -> None:
    names = []
    for t in range(18):  # more workers than a dashboard page holds (50)
        client = service.client_for("worker", f"token-{t}")
        for i in range(NAMES_PER_TOKEN):
            names.append(f"w{t}-{i}")
            assert register(client, names[-1], images=[f"img-{t}-{i}"]).status_code == 201
    newest_first = list(reversed(names))  # registered one after another: last seen first

    whole = service.client.get("/api/v1/workers")  # the default page (100) holds them all
    assert whole.status_code == 200 and "x-next-cursor" not in whole.headers
    assert [w["name"] for w in whole.json()] == newest_first
    assert set(whole.json()[0]) >= {"id", "name", "images", "devices", "last_seen_at"}

    pages = _pages(service, limit=20)
    assert [len(p) for p in pages] == [20, 20, 14]
    assert [n for p in pages for n in p] == newest_first

    assert service.client.get("/api/v1/workers", params={"cursor": "nope"}).status_code == 422
    assert service.client.get("/api/v1/workers", params={"limit": 501}).status_code == 422

    browser = service.dashboard()
    dashboard_pages: list[list[str]] = []
    url: str | None = "/workers"
    while url is not None:
        page = browser.get(url)
        assert page.status_code == 200, page.text[:500]
        dashboard_pages.append(re.findall(r'<a href="/\?worker=[^"]*">([^<]+)</a>', page.text))
        older = re.search(r'<a href="([^"]+)" rel="next">', page.text)
        url = older.group(1).replace("&amp;", "&") if older else None
    assert [len(p) for p in dashboard_pages] == [50, 4]
    assert [n for p in dashboard_pages for n in p] == newest_first
