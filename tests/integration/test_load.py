"""Waiting costs nothing shared: hundreds of event streams and long-poll claims held open
against a real `repro serve` leave `/healthz` and the runs list answering, end cleanly when
the server stops, and past the configured bounds get 503 with Retry-After.

Run alone with `pytest -m load`. Loopback only; every client stops by itself.
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.integration.jobs import REPO
from tests.integration.load_clients import (
    Claims,
    Stream,
    claim_until,
    follow,
    percentile,
    raise_open_files_limit,
    timed_get,
)
from tests.integration.service_procs import Service

pytestmark = pytest.mark.load

STREAMS, CLAIMS, RUNS, PROBES = 500, 100, 5, 100
SEED001 = (REPO / "examples" / "seed001.yaml").read_text()
# No lease expires during a test: the runs the streams follow stay running.
SERVER_ENV = {"REPRO_LEASE_SECONDS": "600"}


def running_runs(service: Service, count: int) -> tuple[list[int], str]:
    """`count` runs held (running) by one worker, and a worker token with no run to claim."""
    ids = []
    for _ in range(count):
        submitted = service.submit(SEED001)
        assert submitted.status_code == 201, submitted.text
        ids.append(submitted.json()["run"]["id"])
    holder = service.client_for("worker", "holder")
    worker = holder.post("/api/v1/workers/register", json={"name": "holder"}).json()["id"]
    for _ in ids:
        assert holder.post(f"/api/v1/workers/{worker}/claim").status_code == 200
    return ids, service.token("worker", "idle")


def register_workers(service: Service, token: str, count: int) -> list[int]:
    with httpx.Client(base_url=service.url, headers={"Authorization": f"Bearer {token}"}) as c:
        return [
            c.post("/api/v1/workers/register", json={"name": f"idle-{i}"}).json()["id"]
            for i in range(count)
        ]


async def probe(port: int, path: str, token: str) -> list[float]:
    """Seconds each of PROBES sequential requests took; each must succeed."""
    took = []
    for _ in range(PROBES):
        status, seconds = await timed_get(port, path, token)
        assert status == 200, f"{path} answered {status} under load"
        took.append(seconds)
    return took


def stop_server(service: Service) -> int:
    """SIGTERM the server and wait for it to exit; its exit status."""
    service.proc.send_signal(signal.SIGTERM)
    try:
        return service.proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        service.proc.kill()
        raise AssertionError("the server did not stop within 60 s of SIGTERM") from None


def test_hundreds_of_waiting_requests_leave_the_api_answering_and_end_on_shutdown(
    tmp_path: Path, database_url: str | None
) -> None:
    raise_open_files_limit(4 * (STREAMS + CLAIMS))
    service = Service(
        tmp_path / "data", database_url=database_url, env=SERVER_ENV, extra=("--no-demo",)
    )
    try:
        service.wait_ready()
        run_ids, worker_token = running_runs(service, RUNS)
        workers = register_workers(service, worker_token, CLAIMS)
        viewer = service.token("viewer", "dashboard")
        outcome = asyncio.run(load(service, run_ids, workers, viewer, worker_token))
    finally:
        service.stop()
    streams: list[Stream] = outcome["streams"]
    claims: list[Claims] = outcome["claims"]

    assert [s.status for s in streams] == [200] * STREAMS
    # While held, /healthz and the runs list answered promptly (p99 of PROBES each).
    assert outcome["healthz_p99"] < 1.0, outcome
    assert outcome["runs_p99"] < 1.0, outcome
    # One write to a run reached every stream that follows it, which then ended.
    cancelled = [s for s in streams if s.statuses[-1:] == ["cancelled"]]
    assert len(cancelled) == STREAMS // RUNS
    assert all(s.statuses == ["running", "cancelled"] for s in cancelled)
    # On SIGTERM the server stopped, ending every other stream with its last chunk, and
    # answering every waiting claim.
    assert outcome["exit_status"] == 0
    assert all(s.ended_cleanly and s.error is None for s in streams), [
        (s.statuses, s.error) for s in streams if not s.ended_cleanly or s.error
    ][:5]
    assert all(c.error is None and set(c.statuses) == {204} for c in claims), [
        (c.statuses, c.error) for c in claims if c.error or set(c.statuses) != {204}
    ][:5]


async def load(
    service: Service, run_ids: list[int], workers: list[int], viewer: str, worker_token: str
) -> dict[str, Any]:
    port = service.port
    streams = [Stream() for _ in range(STREAMS)]
    claims = [Claims() for _ in workers]
    stop_claiming = asyncio.Event()
    tasks = [
        asyncio.create_task(follow(port, run_ids[i % len(run_ids)], viewer, s))
        for i, s in enumerate(streams)
    ]
    tasks += [
        asyncio.create_task(claim_until(port, w, worker_token, c, stop_claiming))
        for w, c in zip(workers, claims, strict=True)
    ]
    try:
        await asyncio.wait_for(asyncio.gather(*(s.first_event.wait() for s in streams)), 120)
        await until_held(port, viewer, STREAMS, len(workers))
        healthz = await probe(port, "/healthz", viewer)
        runs = await probe(port, "/api/v1/runs?limit=50", viewer)
        cancel = await asyncio.to_thread(service.client.post, f"/api/v1/runs/{run_ids[0]}/cancel")
        assert cancel.status_code == 200, cancel.text
        stop_claiming.set()  # claims waiting now are answered by the shutdown
        exit_status = await asyncio.to_thread(stop_server, service)
        await asyncio.wait_for(asyncio.gather(*tasks), 30)  # every client saw its end
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    return {
        "streams": streams,
        "claims": claims,
        "healthz_p99": percentile(healthz, 0.99),
        "runs_p99": percentile(runs, 0.99),
        "exit_status": exit_status,
    }


async def until_held(port: int, token: str, streams: int, claims: int) -> None:
    """Return once the server reports that many open streams and waiting claims."""
    wanted = {"reprotrain_event_streams_open": streams, "reprotrain_claims_waiting": claims}
    seen: dict[str, float] = {}
    for _ in range(600):
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
            text = (await client.get("/metrics", headers={"Authorization": f"Bearer {token}"})).text
        seen = {
            line.split()[0]: float(line.split()[1])
            for line in text.splitlines()
            if line.split(" ")[0] in wanted
        }
        if all(seen.get(name) == value for name, value in wanted.items()):
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"the server never held them all: {seen}")


def test_past_the_bounds_streams_and_claims_get_503_with_retry_after(tmp_path: Path) -> None:
    service = Service(
        tmp_path / "data",
        env={**SERVER_ENV, "REPRO_MAX_EVENT_STREAMS": "3", "REPRO_MAX_WAITING_CLAIMS": "2"},
        extra=("--no-demo",),
    )
    try:
        service.wait_ready()
        run_ids, worker_token = running_runs(service, 1)
        workers = register_workers(service, worker_token, 3)
        viewer = service.token("viewer", "dashboard")
        asyncio.run(bounded(service.port, run_ids[0], workers, viewer, worker_token))
    finally:
        service.stop()


async def bounded(port: int, run_id: int, workers: list[int], viewer: str, worker: str) -> None:
    held = [Stream() for _ in range(3)]
    claims = [Claims() for _ in range(2)]
    stop = asyncio.Event()
    tasks = [asyncio.create_task(follow(port, run_id, viewer, s)) for s in held]
    tasks += [
        asyncio.create_task(claim_until(port, w, worker, c, stop))
        for w, c in zip(workers, claims, strict=False)
    ]
    try:
        await asyncio.gather(*(s.first_event.wait() for s in held))
        await until_held(port, viewer, 3, 2)
        refused = Stream()
        await follow(port, run_id, viewer, refused)
        assert refused.status == 503 and int(refused.headers["retry-after"]) >= 1
        assert b"REPRO_MAX_EVENT_STREAMS" in refused.body
        one_more = Claims()
        await claim_until(port, workers[2], worker, one_more, asyncio.Event())
        assert one_more.statuses == [503]
        # The /healthz of a server at its bounds still answers.
        assert (await timed_get(port, "/healthz", viewer))[0] == 200
        # A stream that ends gives its place back.
        tasks[0].cancel()
        await asyncio.gather(tasks[0], return_exceptions=True)
        await until_held(port, viewer, 2, 2)
        again = Stream()
        follower = asyncio.create_task(follow(port, run_id, viewer, again))
        tasks.append(follower)
        await asyncio.wait_for(again.first_event.wait(), 30)
        assert again.status == 200 and again.statuses == ["running"]
    finally:
        stop.set()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
