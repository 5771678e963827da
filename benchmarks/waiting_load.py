"""Waiting requests: what 500 open event streams and 100 waiting claims cost the API.

For each database (SQLite, and a private PostgreSQL server), a fresh `repro serve` holding
1,000 runs serves `GET /runs/{id}` under a closed loop of 16 requests in flight from two
load processes (load_api.py) for a fixed time, first alone (the baseline), then while this
process holds 500 event streams (100 on each of 5 running runs) and 100 long-poll claims
of idle workers open on the same server. Ratio: requests/s with them ÷ without. Also shown:
`/healthz` p99 while they are held (100 requests, before the second load), and the server's
peak resident memory (VmHWM) against its resident memory before they opened.

    .venv/bin/python -m benchmarks --only waiting
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import httpx

from benchmarks.api_throughput import CONCURRENCY, PROCESSES
from benchmarks.fill import fill_runs
from benchmarks.load_api import REQUEST_TIMEOUT, Plan, figures, run_load, spec_named, split_threads
from benchmarks.rounds import progress
from benchmarks.rows import Row
from benchmarks.servers import DATABASE_NAMES, DATABASES, Server, api_server
from tests.integration.load_clients import (
    Claims,
    Stream,
    claim_until,
    follow,
    percentile,
    raise_open_files_limit,
    timed_get,
)

STREAMS, CLAIMS, FOLLOWED_RUNS, RUNS = 500, 100, 5, 1000
# 4 s a load, as in the API section: about 400 requests a side at these rates.
SECONDS, QUICK_SECONDS = 4.0, 1.5
TARGET = 0.8  # waiting requests may cost a fifth of the rate, no more


@contextlib.contextmanager
def _long_leases() -> Iterator[None]:
    # The runs the streams follow stay running for the whole measurement.
    before = os.environ.get("REPRO_LEASE_SECONDS")
    os.environ["REPRO_LEASE_SECONDS"] = "600"
    try:
        yield
    finally:
        if before is None:
            del os.environ["REPRO_LEASE_SECONDS"]
        else:
            os.environ["REPRO_LEASE_SECONDS"] = before


def _memory_kib(pid: int) -> dict[str, int]:
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, value = line.partition(":")
        if name in ("VmRSS", "VmHWM"):
            fields[name] = int(value.split()[0])
    return fields


def _get_run_rate(server: Server, token: str, run_ids: list[int], seconds: float) -> Any:
    plans = [
        Plan(
            url=server.url,
            token=token,
            run_ids=tuple(run_ids),
            experiment_ids=(1,),
            threads=threads,
            duration=seconds,
            seed=20241123,
            process_index=i,
            kinds=("get_run",),
            weights=(1.0,),
        )
        for i, threads in enumerate(split_threads(CONCURRENCY, PROCESSES))
    ]
    outcomes = run_load(plans, timeout=seconds + REQUEST_TIMEOUT + 120)
    records = [r for o in outcomes for r in o.records]
    return figures("get_run", records, max(o.elapsed for o in outcomes))


class _Holder:
    """500 streams and 100 waiting claims held open from a thread of this process."""

    def __init__(self, port: int, run_ids: list[int], workers: list[int], tokens: dict[str, str]):
        self.port, self.run_ids, self.workers, self.tokens = port, run_ids, workers, tokens
        self.streams = [Stream() for _ in range(STREAMS)]
        self.claims = [Claims() for _ in workers]
        self.held = threading.Event()
        self.release = threading.Event()
        self.healthz_ms: list[float] = []
        self._thread = threading.Thread(target=lambda: asyncio.run(self._main()), daemon=True)

    def __enter__(self) -> _Holder:
        self._thread.start()
        if not self.held.wait(180):
            raise RuntimeError("the streams and claims were not all open within 180 s")
        return self

    def __exit__(self, *exc: object) -> None:
        self.release.set()
        self._thread.join(timeout=60)

    async def _main(self) -> None:
        stop = asyncio.Event()
        tasks = [
            asyncio.create_task(
                follow(self.port, self.run_ids[i % len(self.run_ids)], self.tokens["viewer"], s)
            )
            for i, s in enumerate(self.streams)
        ]
        tasks += [
            asyncio.create_task(claim_until(self.port, w, self.tokens["worker"], c, stop))
            for w, c in zip(self.workers, self.claims, strict=True)
        ]
        try:
            await asyncio.gather(*(s.first_event.wait() for s in self.streams))
            await self._until_waiting()
            for _ in range(100):  # /healthz while they are held, before the load
                status, seconds = await timed_get(self.port, "/healthz", self.tokens["viewer"])
                if status == 200:
                    self.healthz_ms.append(seconds * 1000)
            self.held.set()
            while not self.release.is_set():
                await asyncio.sleep(0.1)
        finally:
            stop.set()
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _until_waiting(self) -> None:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{self.port}") as client:
            for _ in range(600):
                text = (await client.get("/metrics")).text
                values = {
                    line.split()[0]: float(line.split()[1])
                    for line in text.splitlines()
                    if line.startswith(("reprotrain_event_streams_open ", "reprotrain_claims_"))
                }
                if values.get("reprotrain_event_streams_open") == STREAMS and values.get(
                    "reprotrain_claims_waiting"
                ) == len(self.workers):
                    return
                await asyncio.sleep(0.1)
        raise RuntimeError(f"the server never held them all: {values}")


def _prepare(server: Server) -> tuple[list[int], list[int], list[int], dict[str, str]]:
    """(all run ids, the running runs streams follow, idle worker ids, tokens)."""
    service = server.service
    followed = []
    for i in range(FOLLOWED_RUNS):
        created = service.submit(spec_named(f"followed-{i}"))
        created.raise_for_status()
        followed.append(created.json()["run"]["id"])
    holder = service.client_for("worker", "holder")
    worker = holder.post("/api/v1/workers/register", json={"name": "holder"}).json()["id"]
    for _ in followed:
        if holder.post(f"/api/v1/workers/{worker}/claim").status_code != 200:
            raise RuntimeError("could not hold the followed runs")
    fill_runs(server.database_url, RUNS, queued=0)
    tokens = {"viewer": server.token("viewer"), "worker": server.token("worker", "idle")}
    headers = {"Authorization": f"Bearer {tokens['worker']}"}
    with httpx.Client(base_url=server.url, headers=headers) as client:
        workers = [
            client.post("/api/v1/workers/register", json={"name": f"idle-{i}"}).json()["id"]
            for i in range(CLAIMS)
        ]
    listed = service.client.get("/api/v1/runs", params={"limit": 500}).json()["items"]
    return [r["id"] for r in listed], followed, workers, tokens


def measure_database(database: str, seconds: float) -> list[Row]:
    name = DATABASE_NAMES[database]
    with _long_leases(), api_server(database) as server:
        progress(f"waiting, {name}: {RUNS:,} runs, {FOLLOWED_RUNS} running")
        run_ids, followed, workers, tokens = _prepare(server)
        reader = server.token("viewer", "bench-reader")
        pid = server.service.proc.pid
        progress(f"waiting, {name}: GET /runs/{{id}} alone, {seconds:.0f} s")
        alone = _get_run_rate(server, reader, run_ids, seconds)
        idle_kib = _memory_kib(pid)["VmRSS"]
        progress(f"waiting, {name}: holding {STREAMS} streams + {CLAIMS} claims")
        with _Holder(server.service.port, followed, workers, tokens) as held:
            progress(f"waiting, {name}: GET /runs/{{id}} while they are held, {seconds:.0f} s")
            loaded = _get_run_rate(server, reader, run_ids, seconds)
            healthz_p99 = (
                percentile(sorted(held.healthz_ms), 99) if held.healthz_ms else float("nan")
            )
        peak_kib = _memory_kib(pid)["VmHWM"]
        refused = sum(1 for s in held.streams if s.status != 200)
    failed = loaded.errors + alone.errors + refused
    ratio = loaded.rps / alone.rps if alone.rps else None
    held_text = f"{STREAMS} event streams + {CLAIMS} waiting claims"
    return [
        Row(
            section="waiting",
            benchmark="GET /runs/{id} req/s with waiting requests vs without",
            configuration=f"{name}, {held_text} held, {CONCURRENCY} in flight: p99 "
            f"{loaded.p99_ms:.0f} ms (alone {alone.p99_ms:.0f} ms), /healthz p99 "
            f"{healthz_p99:.0f} ms" + (f", {failed} FAILED" if failed else ""),
            unit="req/s",
            measured=loaded.rps,
            baseline=alone.rps,
            ratio=ratio,
            target=f">= {TARGET:.2f}",
            met=ratio is not None and ratio >= TARGET and not failed,
            cause=""
            if ratio is None or ratio >= TARGET
            else "waiting requests cost the server CPU time: see its reader and claim looks",
            params={
                "database": database,
                "streams": STREAMS,
                "claims": CLAIMS,
                "p99_ms": loaded.p99_ms,
                "baseline_p99_ms": alone.p99_ms,
                "healthz_p99_ms": healthz_p99,
                "errors": failed,
            },
        ),
        Row(
            section="waiting",
            benchmark="server memory at peak vs before the waiting requests",
            configuration=f"{name}, {held_text}: peak RSS (VmHWM) against RSS after the "
            "baseline load",
            unit="MB",
            measured=peak_kib / 1024,
            baseline=idle_kib / 1024,
            ratio=peak_kib / idle_kib,
            params={"database": database, "peak_kib": peak_kib, "idle_kib": idle_kib},
        ),
    ]


def measure(quick: bool, databases: Sequence[str] = DATABASES) -> list[Row]:
    raise_open_files_limit(4 * (STREAMS + CLAIMS))
    rows: list[Row] = []
    for database in databases:
        rows += measure_database(database, QUICK_SECONDS if quick else SECONDS)
    return rows
