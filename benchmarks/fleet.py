"""Heartbeats of a fleet: how many training jobs one and two API processes keep, with every
heartbeat answered within a second (p99) and no lease lost.

Simulated agents, one per running run, send the real heartbeat (`POST /runs/{id}/heartbeat`
with the worker, the attempt and a progress document that changes every time) on one kept
connection each, at the agent's cadence: new progress at most once a `REPRO_PROGRESS_SECONDS`
(5 s), which is what a training job sends. Against PostgreSQL, with `repro serve` processes
sharing it; every sender and server on 127.0.0.1. The fleet grows step by step until the
p99 passes 1 s or a heartbeat is refused; the row gives the largest fleet held.

Baseline, in the same run: the same fleets at the cadence agents had before the setting
(new progress once a second). Target: at least 1,000 concurrent jobs on two API processes.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from tempfile import TemporaryDirectory

from sqlalchemy import create_engine, insert, select
from sqlalchemy.orm import Session

from benchmarks.load_api import percentile
from benchmarks.rounds import progress
from benchmarks.rows import Row
from service.persistence.models import ApiToken, Experiment, Run, Worker, utcnow
from tests.integration.load_clients import raise_open_files_limit

NEW_CADENCE, OLD_CADENCE = 5.0, 1.0  # seconds between a job's heartbeats (progress)
# The fleets tried, smallest first, at the new cadence and at the old one.
FLEETS = (250, 500, 750, 1000, 1250, 1500, 2000)
OLD_FLEETS = (25, 50, 100, 150, 200, 300, 400, 600)
QUICK_FLEETS, QUICK_OLD_FLEETS = (50, 100), (10, 20)
TARGET_JOBS = 1000
P99_LIMIT = 1.0  # seconds
WORKERS_PER_TOKEN = 200  # below the per-token cap on worker names
ENV = {"REPRO_LEASE_SECONDS": "30", "REPRO_PROGRESS_SECONDS": str(NEW_CADENCE)}


@dataclass
class Agent:
    run_id: int
    worker_id: int
    token: str


@dataclass
class Load:
    jobs: int
    cadence: float
    p99: float  # seconds
    sent: int
    refused: int  # any answer but 200: a lease the agent would have lost

    @property
    def held(self) -> bool:
        return self.refused == 0 and self.p99 < P99_LIMIT and self.sent > 0


@contextmanager
def api_processes(count: int, workdir: Path) -> Iterator[tuple[list[int], str, list[str]]]:
    """`count` `repro serve` processes on one private PostgreSQL database, and worker tokens
    enough for the largest fleet: (ports, database url, token secrets by name fleet-<i>)."""
    from tests.integration.service_procs import Service
    from tests.postgres import PostgresServer

    with ExitStack() as stack:
        url = stack.enter_context(PostgresServer()).create_database("fleet")
        services = []
        for _ in range(count):  # one after the other: the first migrates
            service = Service(workdir / "data", database_url=url, extra=("--no-demo",), env=ENV)
            stack.callback(service.stop)
            services.append(service.wait_ready(timeout=120))
        tokens = [services[0].token("worker", name) for name in _token_names()]
        yield [s.port for s in services], url, tokens


def _token_names() -> list[str]:
    return [f"fleet-{i}" for i in range(-(-FLEETS[-1] // WORKERS_PER_TOKEN))]


def _agents(url: str, tokens: list[str], jobs: int) -> list[Agent]:
    """`jobs` runs, each running on a worker of its own under the given worker tokens."""
    engine = create_engine(url)
    now = utcnow()
    try:
        with Session(engine) as db:
            token_ids = {name: id_ for name, id_ in db.execute(select(ApiToken.name, ApiToken.id))}
            experiment = Experiment(
                name="fleet",
                spec={},
                spec_hash="sha256:fleet",
                submitted_spec_hash="sha256:fleet",
                seed=[1, 0],
                seed_source="spec",
            )
            db.add(experiment)
            db.flush()
            worker_rows = [
                {
                    "name": f"fleet-worker-{i}",
                    "token_id": token_ids[_token_names()[i // WORKERS_PER_TOKEN]],
                    "executors": ["process"],
                    "images": [],
                    "registered_at": now,
                    "last_seen_at": now,
                }
                for i in range(jobs)
            ]
            worker_ids = db.scalars(insert(Worker).returning(Worker.id), worker_rows).all()
            run_rows = [
                {
                    "experiment_id": experiment.id,
                    "status": "running",
                    "attempt": 1,
                    "worker_id": worker_id,
                    "lease_expires_at": now + timedelta(hours=1),
                    "heartbeat_at": now,
                    "started_at": now,
                    "created_at": now,
                }
                for worker_id in worker_ids
            ]
            run_ids = db.scalars(insert(Run).returning(Run.id), run_rows).all()
            db.commit()
    finally:
        engine.dispose()
    return [
        Agent(run_id, worker_id, tokens[i // WORKERS_PER_TOKEN])
        for i, (run_id, worker_id) in enumerate(zip(run_ids, worker_ids, strict=True))
    ]


async def _agent(
    agent: Agent,
    port: int,
    cadence: float,
    until: float,
    latencies: list[float],
    refused: list[int],
) -> None:
    await asyncio.sleep(random.uniform(0, cadence))  # agents start at different times
    connection: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None
    step = 0
    try:
        while time.monotonic() < until:
            step += 1
            progress_doc = {"event": "step", "epoch": 1, "step": step, "loss": 1 / step}
            body = json.dumps(
                {"worker_id": agent.worker_id, "attempt": 1, "progress": progress_doc}
            ).encode()
            request = (
                f"POST /api/v1/runs/{agent.run_id}/heartbeat HTTP/1.1\r\n"
                f"Host: 127.0.0.1:{port}\r\nAuthorization: Bearer {agent.token}\r\n"
                f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
            ).encode() + body
            started = time.monotonic()
            for _ in range(2):  # as an HTTP client does: a kept connection the server closed
                if connection is None:  # while idle is opened again, and the request resent
                    connection = await asyncio.open_connection("127.0.0.1", port)
                try:
                    status = await _exchange(*connection, request)
                    break
                except (asyncio.IncompleteReadError, ConnectionError):
                    connection[1].close()
                    connection = None
            else:
                raise RuntimeError(f"heartbeat of run {agent.run_id}: the server hung up twice")
            latencies.append(time.monotonic() - started)
            if status != 200:
                refused.append(agent.run_id)
            await asyncio.sleep(max(0.0, started + cadence - time.monotonic()))
    finally:
        if connection is not None:
            connection[1].close()


async def _exchange(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, request: bytes
) -> int:
    """Send one request on a kept connection; its status, once the whole answer is read."""
    writer.write(request)
    await writer.drain()
    head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
    length = next(
        int(line.split(":", 1)[1]) for line in head if line.lower().startswith("content-length:")
    )
    await reader.readexactly(length)
    return int(head[0].split()[1])


def _load(agents: list[Agent], ports: list[int], cadence: float, seconds: float) -> Load:
    latencies: list[float] = []
    refused: list[int] = []

    async def main() -> None:
        until = time.monotonic() + seconds
        await asyncio.gather(
            *(
                _agent(agent, ports[i % len(ports)], cadence, until, latencies, refused)
                for i, agent in enumerate(agents)
            )
        )

    asyncio.run(main())
    return Load(
        len(agents), cadence, percentile(sorted(latencies), 99), len(latencies), len(refused)
    )


def _largest_fleet(
    agents: list[Agent], ports: list[int], cadence: float, fleets: Sequence[int], seconds: float
) -> tuple[Load | None, Load | None]:
    """(the largest fleet held, the first one not held) at this cadence."""
    held = None
    for jobs in fleets:
        load = _load(agents[:jobs], ports, cadence, seconds)
        progress(
            f"fleet: {len(ports)} API, {jobs} jobs every {cadence:.0f} s: p99 "
            f"{load.p99 * 1000:.0f} ms, {load.sent} sent, {load.refused} refused"
        )
        if not load.held:
            return held, load
        held = load
    return held, None


def measure(quick: bool) -> list[Row]:
    fleets, old_fleets = (QUICK_FLEETS, QUICK_OLD_FLEETS) if quick else (FLEETS, OLD_FLEETS)
    seconds = 2 * NEW_CADENCE if quick else 3 * NEW_CADENCE
    raise_open_files_limit(4 * fleets[-1] + 256)
    rows: list[Row] = []
    for processes in (1, 2):
        with (
            TemporaryDirectory(prefix="bench-fleet-") as tmp,
            api_processes(processes, Path(tmp)) as (ports, url, tokens),
        ):
            agents = _agents(url, tokens, fleets[-1])
            new, new_miss = _largest_fleet(agents, ports, NEW_CADENCE, fleets, seconds)
            old, old_miss = _largest_fleet(agents, ports, OLD_CADENCE, old_fleets, seconds / 2)
        rows.append(_row(processes, new, new_miss, old, old_miss))
    return rows


def _row(
    processes: int, new: Load | None, new_miss: Load | None, old: Load | None, old_miss: Load | None
) -> Row:
    jobs = new.jobs if new else 0
    base = old.jobs if old else 0
    target = processes == 2
    return Row(
        section="fleet",
        benchmark="concurrent jobs at heartbeat p99 < 1 s, progress every 5 s vs every 1 s",
        configuration=f"{processes} API process{'es' * (processes > 1)}, PostgreSQL: "
        + _says(new, new_miss)
        + f"; at 1 s: {_says(old, old_miss)}",
        unit="jobs",
        measured=jobs,
        baseline=base or None,
        ratio=jobs / base if base else None,
        target=f">= {TARGET_JOBS} jobs" if target else "",
        met=jobs >= TARGET_JOBS if target else None,
        cause=""
        if not target or jobs >= TARGET_JOBS
        else "the API processes' CPU: each heartbeat is one request through FastAPI and "
        "one UPDATE; two processes share 2 cores with PostgreSQL and the senders",
        params={"processes": processes, "jobs": jobs, "baseline_jobs": base},
    )


def _says(held: Load | None, miss: Load | None) -> str:
    text = f"{held.jobs} held (p99 {held.p99 * 1000:.0f} ms)" if held else "none held"
    if miss is not None:
        text += f", {miss.jobs} not (p99 {miss.p99 * 1000:.0f} ms, {miss.refused} refused)"
    return text


if __name__ == "__main__":
    import sys

    from benchmarks.rows import render_table

    print(render_table(measure("--quick" in sys.argv[1:])))
