"""Section 6, scaling: how request latency grows with 1k, 10k and 100k runs stored.

For each database, one fresh server (migrated, so every index of migrations/ is in place)
is filled step by step to 1,000, 10,000 and 100,000 runs. At each size one client on
127.0.0.1 sends each request in turn, one at a time on an otherwise idle server, and each
request keeps its median latency. The baseline of every row is the same request at 1,000
runs: a ratio near 1 means the request does not grow with the table.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import httpx

from benchmarks.fill import fill_runs
from benchmarks.load_api import spec_named
from benchmarks.rounds import progress
from benchmarks.rows import Row
from benchmarks.servers import DATABASE_NAMES, DATABASES, Server, api_server
from service.api.run_pages import encode_cursor

# Issue 15: the page 90% deep (by cursor) costs at most this much more than page 1.
DEEP_PAGE_TARGET = 1.5

REQUESTS = {
    "submit": "POST /experiments",
    "claim": "POST /workers/{id}/claim",
    "runs_page": "GET /runs?limit=50",
    "deep_offset": "GET /runs?limit=50&offset=90%",
    "deep_cursor": "GET /runs?limit=50&cursor=(90% deep)",
    "status_filter": "GET /runs?limit=50&status=failed",
}


@dataclass(frozen=True)
class Budget:
    sizes: tuple[int, ...]
    samples: int  # timed requests of each kind at each size, after one untimed


FULL = Budget(sizes=(1_000, 10_000, 100_000), samples=15)
QUICK = Budget(sizes=(200, 1_000), samples=3)


class Requests:
    """The requests of this section, against one server, each returning when answered."""

    def __init__(self, server: Server) -> None:
        submitter = server.token("submitter", "bench-scaling")
        self.client = httpx.Client(
            base_url=server.url, headers={"Authorization": f"Bearer {submitter}"}, timeout=60
        )
        worker_token = server.token("worker", "bench-scaling")
        self.worker = httpx.Client(
            base_url=server.url, headers={"Authorization": f"Bearer {worker_token}"}, timeout=60
        )
        registered = self.worker.post("/api/v1/workers/register", json={"name": "bench-scaling"})
        registered.raise_for_status()
        self.worker_id = registered.json()["id"]
        self.total = 0
        self.submitted = 0

    def close(self) -> None:
        self.client.close()
        self.worker.close()

    def _get(self, **params: str | int) -> None:
        self.client.get("/api/v1/runs", params={"limit": 50, **params}).raise_for_status()

    def submit(self) -> None:
        self.submitted += 1
        self.client.post(
            "/api/v1/experiments",
            content=spec_named(f"scaling-{self.submitted}"),
            headers={"Content-Type": "application/yaml"},
        ).raise_for_status()

    def claim(self) -> None:
        claimed = self.worker.post(f"/api/v1/workers/{self.worker_id}/claim")
        claimed.raise_for_status()
        if claimed.status_code == 204:
            raise RuntimeError("nothing queued to claim")
        run_id = claimed.json()["run"]["id"]
        # Give it back, untimed, so the next claim meets the same queue.
        self.worker.post(
            f"/api/v1/runs/{run_id}/release",
            json={"worker_id": self.worker_id, "reason": "benchmark"},
        ).raise_for_status()

    def runs_page(self) -> None:
        self._get()

    def deep_offset(self) -> None:
        self._get(offset=self.total * 9 // 10)

    def deep_cursor(self) -> None:
        # The cursor a client holds after paging through 90% of the runs (ids are dense
        # here: the runs were filled in one sequence).
        self._get(cursor=encode_cursor(max(self.total // 10, 1)))

    def status_filter(self) -> None:
        self._get(status="failed")


def timed_medians(requests: Requests, samples: int) -> dict[str, float]:
    """Median milliseconds of each kind of request, sent in turn (one untimed first)."""
    calls: dict[str, Callable[[], None]] = {kind: getattr(requests, kind) for kind in REQUESTS}
    times: dict[str, list[float]] = {kind: [] for kind in REQUESTS}
    for i in range(samples + 1):
        for kind, call in calls.items():
            began = time.perf_counter()
            call()
            if i:
                times[kind].append((time.perf_counter() - began) * 1000)
    return {kind: statistics.median(values) for kind, values in times.items()}


def measure_database(database: str, budget: Budget) -> list[Row]:
    name = DATABASE_NAMES[database]
    medians: dict[int, dict[str, float]] = {}
    with api_server(database) as server:
        requests = Requests(server)
        try:
            stored = 0
            for size in budget.sizes:
                progress(f"scaling, {name}: filling to {size:,} runs")
                submitted = requests.submitted
                requests.total = fill_runs(server.database_url, size - stored)
                medians[size] = timed_medians(requests, budget.samples)
                stored = requests.total + requests.submitted - submitted
        finally:
            requests.close()
    base = budget.sizes[0]
    rows = []
    for size in budget.sizes:
        ratio = medians[size]["deep_cursor"] / medians[size]["runs_page"]
        rows.append(
            Row(
                # Shown with the API's read-path targets (and kept out of the latency-growth
                # plot, whose rows compare a request with itself at the smallest size).
                section="api",
                benchmark="runs page 90% deep by cursor vs page 1",
                configuration=f"GET /runs?limit=50, {name}, N = {size:,} (median of "
                f"{budget.samples})",
                unit="ms",
                measured=medians[size]["deep_cursor"],
                baseline=medians[size]["runs_page"],
                ratio=ratio,
                target=f"<= {DEEP_PAGE_TARGET}",
                met=ratio <= DEEP_PAGE_TARGET,
                cause=""
                if ratio <= DEEP_PAGE_TARGET
                else "the deep page read more rows than page 1: see the query plan of "
                "runs by (kind, id)",
                params={"database": database, "request": "deep_cursor", "runs": size},
            )
        )
    for kind, what in REQUESTS.items():
        for size in budget.sizes[1:]:
            ratio = medians[size][kind] / medians[base][kind]
            rows.append(
                Row(
                    section="scaling",
                    benchmark=f"latency at N runs vs {base:,}",
                    configuration=f"{what}, {name}, N = {size:,}",
                    unit="ms",
                    measured=medians[size][kind],
                    baseline=medians[base][kind],
                    ratio=ratio,
                    params={"database": database, "kind": kind, "runs": size, "base": base},
                )
            )
    return rows


def measure(quick: bool, databases: Sequence[str] = DATABASES) -> list[Row]:
    budget = QUICK if quick else FULL
    rows: list[Row] = []
    for database in databases:
        rows += measure_database(database, budget)
    return rows
