"""`/metrics` labels come from closed sets, against a real `repro serve` process: thousands of
requests with made-up methods, paths and ids add no series, so neither the server's memory
nor the size of a scrape grows with what clients send.

Talks to 127.0.0.1 only, sends a bounded number of requests and stops by itself.
"""

from __future__ import annotations

import random
import string
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.integration.service_procs import Service

REQUEST_METRIC = "reprotrain_http_request_duration_seconds"
METHODS, PATHS = 2000, 500


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    data_dir: Path = tmp_path_factory.mktemp("labels") / "data"
    svc = Service(data_dir, extra=("--no-demo",))
    try:
        yield svc.wait_ready()
    finally:
        svc.stop()


def request_series(client: httpx.Client) -> list[str]:
    """The sample lines of the request metric in a scrape of `/metrics`."""
    got = client.get("/metrics")
    assert got.status_code == 200, got.text
    return [line for line in got.text.splitlines() if line.startswith(REQUEST_METRIC)]


def odd(rng: random.Random, size: int) -> str:
    return "".join(rng.choices(string.ascii_letters + string.digits, k=size))


def send_odd_requests(client: httpx.Client, rng: random.Random, count: int) -> set[int]:
    """Made-up methods on a known and an unknown path, made-up paths and made-up ids, and a
    few refused requests; the statuses they got."""
    statuses = set()
    for _ in range(count):
        method = odd(rng, 64).upper()
        statuses.add(client.request(method, "/healthz").status_code)
        statuses.add(client.request(method, f"/{odd(rng, 12)}").status_code)
        statuses.add(client.request(method.lower(), "/api/v1/runs").status_code)
    for _ in range(PATHS if count > 1 else 1):
        statuses.add(client.get(f"/{odd(rng, 40)}/{odd(rng, 8)}").status_code)
        statuses.add(client.get(f"/api/v1/runs/{rng.randrange(10**6, 10**9)}").status_code)
        statuses.add(client.get(f"/api/v1/runs/{odd(rng, 10)}").status_code)
        statuses.add(client.delete(f"/api/v1/experiments/{odd(rng, 10)}").status_code)
    return statuses


def send_refused_requests(client: httpx.Client) -> set[int]:
    """A malformed body and a malformed token, once each (more would meet the failed-auth
    limit, whose 429 is one more status, not one per request)."""
    return {
        client.post("/api/v1/experiments", content=b"{").status_code,
        client.get("/api/v1/runs", headers={"Authorization": "Bearer x"}).status_code,
    }


@pytest.mark.load
def test_made_up_methods_paths_and_ids_add_no_series(service: Service) -> None:
    rng = random.Random(20260101)
    # Once each, so every series these requests can have exists before counting.
    statuses = send_odd_requests(service.client, rng, 1) | send_refused_requests(service.client)
    request_series(service.client)  # and the scrape's own series
    before = request_series(service.client)
    statuses |= send_odd_requests(service.client, rng, METHODS)
    after = request_series(service.client)

    assert {401, 404, 405, 422}.issubset(statuses), statuses  # the requests reached the app
    added = {line.rsplit(" ", 1)[0] for line in after} - {line.rsplit(" ", 1)[0] for line in before}
    assert len(after) == len(before), f"{len(after) - len(before)} lines: {sorted(added)[:5]}"
    labels = [
        sample.labels
        for family in text_string_to_metric_families("\n".join(after))
        for sample in family.samples
    ]
    assert {lab["method"] for lab in labels} <= {"GET", "POST", "DELETE", "other"}
    routes = {lab["route"] for lab in labels}
    assert "<unmatched>" in routes
    assert all(route == "<unmatched>" or route.startswith("/") for route in routes), routes
    assert not any(part.isdigit() for route in routes for part in route.split("/")), routes
