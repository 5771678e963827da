"""Section 5, the API under load: throughput and latency per endpoint, and queue claims.

For each database (SQLite, and a private PostgreSQL server), a fresh `repro serve` gets
10,000 runs, then one endpoint at a time is loaded by a closed loop of 16 requests in
flight from two separate processes on 127.0.0.1 (the load processes of load_api.py), for
a fixed time. Each endpoint's rate is shown against `GET /healthz` on the same server at
the same concurrency: the floor of the HTTP stack, auth excluded. `/healthz` and the two
reads take turns in rounds, the order reversed every other round, and each
keeps its best round: with one window each, the same code's PostgreSQL detail came out at
0.25 to 0.41 of `/healthz` from run to run. Submissions, which add runs, come last.

Claims: on PostgreSQL, worker threads (in separate processes, each with its own worker
token) register through the API and then claim and complete runs from a pre-filled queue
as fast as they can, with 8 workers against the same loop with 1.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx

from benchmarks.fill import fill_runs
from benchmarks.load_api import (
    REQUEST_TIMEOUT,
    REQUESTS,
    Plan,
    context_switches,
    cpu_seconds,
    figures,
    percentile,
    run_load,
    split_threads,
)
from benchmarks.rounds import progress
from benchmarks.rows import Row
from benchmarks.servers import DATABASE_NAMES, DATABASES, Server, api_server, tree_cpu_seconds

RUNS = 10_000
CONCURRENCY = 16
PROCESSES = 2
ENDPOINTS = ("get_run", "list_runs", "submit")
# The reads' rates as a share of /healthz are information, not targets: each read is
# loaded in turns with /healthz, round by round, and keeps its best round; the others
# once, after them.
ROUNDS_OF = ("healthz", "get_run", "list_runs")
CLAIM_WORKERS = (1, 8)
CLAIM_QUEUE = 4000  # queued runs for the claim loops; more than they get through
MAX_CLAIMS_PER_THREAD = 2000


@dataclass(frozen=True)
class Budget:
    seconds_per_load: float
    runs: int
    rounds: int  # of /healthz and the two reads, each `seconds_per_load` long
    seconds_once: float  # submissions and claims, loaded once each


# 2 rounds of 2 s: the time one 4 s load each took before. 2 s is some 900 requests at the
# slower read here; submissions and claims, slower still, get 4 s. The whole benchmark has
# a 10-minute budget.
FULL = Budget(seconds_per_load=2.0, runs=RUNS, rounds=2, seconds_once=4.0)
QUICK = Budget(seconds_per_load=1.0, runs=500, rounds=2, seconds_once=1.5)


# -- claims (the load process side) ----------------------------------------------------------


@dataclass(frozen=True)
class ClaimPlan:
    url: str
    tokens: tuple[str, ...]  # one worker token per thread: one worker each
    duration: float
    process_index: int


@dataclass
class ClaimOutcome:
    claim_seconds: list[float] = field(default_factory=list)  # claims that returned a run
    empty: int = 0  # claims that found the queue empty
    errors: list[str] = field(default_factory=list)
    elapsed: float = 0.0


def _result(run_id: int) -> dict[str, Any]:
    """A small but complete job result, as a worker reports it."""
    fingerprint = f"blake3:{run_id:064x}"
    return {
        "status": "succeeded",
        "final_fingerprint": fingerprint,
        "trace_granularity": "epoch",
        "trace": [
            {"kind": "init", "epoch": 0, "step": 0, "fingerprint": fingerprint, "variables": {}}
        ],
        "timings": {"training": 0.0},
    }


def _claim_thread(plan: ClaimPlan, token: str, deadline: float, out: ClaimOutcome) -> None:
    headers = {"Authorization": f"Bearer {token}"}
    with httpx.Client(base_url=plan.url, headers=headers, timeout=REQUEST_TIMEOUT) as client:
        try:
            # A worker's name is its identity, held by one token: name it after its token's
            # id (`rpt_<id>_<secret>`), which no other round or thread shares.
            name = f"bench-token-{token.split('_')[1]}"
            registered = client.post("/api/v1/workers/register", json={"name": name})
            registered.raise_for_status()
            worker_id = registered.json()["id"]
            for _ in range(MAX_CLAIMS_PER_THREAD):
                if time.perf_counter() >= deadline:
                    break
                began = time.perf_counter()
                claimed = client.post(f"/api/v1/workers/{worker_id}/claim")
                seconds = time.perf_counter() - began
                if claimed.status_code == 204:
                    out.empty += 1
                    break
                claimed.raise_for_status()
                out.claim_seconds.append(seconds)
                run_id = claimed.json()["run"]["id"]
                client.post(
                    f"/api/v1/runs/{run_id}/complete",
                    json={"worker_id": worker_id, "result": _result(run_id)},
                ).raise_for_status()
        except httpx.HTTPStatusError as exc:
            out.errors.append(f"{exc.request.url.path}: {exc.response.text[:300]}")
        except httpx.HTTPError as exc:
            out.errors.append(f"{type(exc).__name__}: {exc}"[:300])


def claim_process(plan: ClaimPlan, start: Any, results: Any) -> None:
    """Entry point of a claim load process: one thread per token, all started together."""
    mine = [ClaimOutcome() for _ in plan.tokens]
    start.wait(timeout=120)
    began = time.perf_counter()
    deadline = began + plan.duration
    threads = [
        threading.Thread(target=_claim_thread, args=(plan, token, deadline, out), daemon=True)
        for token, out in zip(plan.tokens, mine, strict=True)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=plan.duration + REQUEST_TIMEOUT + 30)
    results.put(
        ClaimOutcome(
            claim_seconds=[s for out in mine for s in out.claim_seconds],
            empty=sum(out.empty for out in mine),
            errors=[e for out in mine for e in out.errors],
            elapsed=time.perf_counter() - began,
        )
    )


# -- the sections (the orchestrating side) -------------------------------------------------


def _load(server: Server, kind: str, plan_base: dict[str, Any], seconds: float) -> Any:
    """The figures of one endpoint's load; `server_cpu_ms` is the server process's CPU time
    per answered request (user + system), which says where a low rate comes from,
    `server_switches` its threads' context switches per request, which show threads taking
    turns at the GIL, `database_cpu_ms` PostgreSQL's CPU and `client_cpu_ms` the load
    processes', which share the machine."""
    plans = [
        Plan(
            **plan_base,
            threads=threads,
            duration=seconds,
            process_index=i,
            kinds=(kind,),
            weights=(1.0,),
        )
        for i, threads in enumerate(split_threads(CONCURRENCY, PROCESSES))
    ]
    pid = server.service.proc.pid
    db_pid = server.database_pid
    db_before = None if db_pid is None else tree_cpu_seconds(db_pid)
    cpu_before, switches_before = cpu_seconds(pid), context_switches(pid)
    outcomes = run_load(plans, timeout=seconds + REQUEST_TIMEOUT + 120)
    cpu_after, switches_after = cpu_seconds(pid), context_switches(pid)
    db_after = None if db_pid is None else tree_cpu_seconds(db_pid)
    elapsed = max(o.elapsed for o in outcomes)
    records = [r for o in outcomes for r in o.records]
    result = figures(kind, records, elapsed)
    errors = [e for o in outcomes for e in o.error_samples]
    if result.errors:
        progress(f"  {kind}: {result.errors} failed requests, e.g. {errors[:2]}")
    if cpu_before is not None and cpu_after is not None and records:
        result.server_cpu_ms = (cpu_after - cpu_before) / len(records) * 1000
    if switches_before is not None and switches_after is not None and records:
        result.server_switches = (switches_after - switches_before) / len(records)
    if db_before is not None and db_after is not None and records:
        result.database_cpu_ms = (db_after - db_before) / len(records) * 1000
    if records:
        result.client_cpu_ms = sum(o.cpu_seconds for o in outcomes) / len(records) * 1000
    return result


def _rounds(server: Server, plan_base: dict[str, Any], budget: Budget) -> dict[str, list[Any]]:
    """Every round's figures of each of ROUNDS_OF, the order reversed every other round, so
    that neither side of a ratio always runs first or right after the fill."""
    out: dict[str, list[Any]] = {kind: [] for kind in ROUNDS_OF}
    for r in range(budget.rounds):
        order = ROUNDS_OF if r % 2 == 0 else tuple(reversed(ROUNDS_OF))
        for kind in order:
            out[kind].append(_load(server, kind, plan_base, budget.seconds_per_load))
    return out


def best(rounds: Sequence[Any]) -> Any:
    """The round with the most requests a second: on a machine shared with the load
    processes, PostgreSQL and anything else, other work only ever takes rate away.
    Figures of a round with failed requests come first, so that failures are never hidden
    behind a clean round."""
    failed = [r for r in rounds if r.errors]
    return max(failed or rounds, key=lambda r: r.rps)


def _claims(server: Server, workers: int, seconds: float) -> tuple[float, list[float], int]:
    """(claims per second, sorted claim latencies in ms, errors) of `workers` claim loops."""
    tokens = [server.token("worker", f"bench-claims-{workers}-{i}") for i in range(workers)]
    processes = min(PROCESSES, workers)
    plans = []
    first = 0
    for i, threads in enumerate(split_threads(workers, processes)):
        plans.append(ClaimPlan(server.url, tuple(tokens[first : first + threads]), seconds, i))
        first += threads
    outcomes = run_load(plans, timeout=seconds + REQUEST_TIMEOUT + 120, target=claim_process)
    elapsed = max(o.elapsed for o in outcomes)
    latencies = sorted(s * 1000 for o in outcomes for s in o.claim_seconds)
    errors = [e for o in outcomes for e in o.errors]
    if errors:
        progress(f"  claims: {len(errors)} worker threads failed, e.g. {errors[:2]}")
    if any(o.empty for o in outcomes):
        progress("  claims: the queue ran dry; the rate is a lower bound")
    return len(latencies) / elapsed, latencies, len(errors)


def _run_ids(server: Server) -> tuple[list[int], list[int]]:
    from sqlalchemy import create_engine, select

    from service.persistence.models import Run

    engine = create_engine(server.database_url)
    try:
        with engine.connect() as conn:
            rows = conn.execute(select(Run.id, Run.experiment_id).order_by(Run.id)).all()
    finally:
        engine.dispose()
    return [r[0] for r in rows], sorted({r[1] for r in rows})


def measure_database(database: str, budget: Budget) -> list[Row]:
    name = DATABASE_NAMES[database]
    rows: list[Row] = []
    with api_server(database) as server:
        progress(f"api, {name}: filling {budget.runs:,} runs")
        fill_runs(server.database_url, budget.runs)
        run_ids, experiment_ids = _run_ids(server)
        plan_base = {
            "url": server.url,
            "token": server.token("submitter", "bench-load"),
            "run_ids": tuple(run_ids),
            "experiment_ids": tuple(experiment_ids),
            "seed": 20240611,
        }
        progress(
            f"api, {name}: {CONCURRENCY} in flight, {budget.rounds} rounds of "
            f"{budget.seconds_per_load:g} s each for {', '.join(ROUNDS_OF)}"
        )
        rounds = _rounds(server, plan_base, budget)
        floor = best(rounds["healthz"])
        for kind in ENDPOINTS:
            if kind in rounds:
                got = best(rounds[kind])
            else:
                got = _load(server, kind, plan_base, budget.seconds_once)
            what = REQUESTS[kind] + (f" of {budget.runs:,}" if kind == "list_runs" else "")
            failed = f", {got.errors} FAILED" if got.errors else ""
            ratio = got.rps / floor.rps
            rows.append(
                Row(
                    section="api",
                    benchmark="API requests/s vs GET /healthz",
                    configuration=f"{what}, {name}, {CONCURRENCY} in flight: "
                    f"p50 {got.p50_ms:.0f} ms, p99 {got.p99_ms:.0f} ms{failed}",
                    unit="req/s",
                    measured=got.rps,
                    baseline=floor.rps,
                    ratio=ratio,
                    params={
                        "database": database,
                        "kind": kind,
                        "server_cpu_ms": got.server_cpu_ms,
                        "baseline_server_cpu_ms": floor.server_cpu_ms,
                        "database_cpu_ms": got.database_cpu_ms,
                        "client_cpu_ms": got.client_cpu_ms,
                        "baseline_client_cpu_ms": floor.client_cpu_ms,
                        "server_switches": got.server_switches,
                        "baseline_server_switches": floor.server_switches,
                        "p50_ms": got.p50_ms,
                        "p99_ms": got.p99_ms,
                        "errors": got.errors,
                        "requests": got.requests,
                        "baseline_p50_ms": floor.p50_ms,
                        "baseline_p99_ms": floor.p99_ms,
                        # Every round's rate, to show how far one window moves.
                        "rounds_rps": [r.rps for r in rounds.get(kind, [got])],
                        "baseline_rounds_rps": [r.rps for r in rounds["healthz"]],
                    },
                )
            )
        if database == "postgresql":
            fill_runs(server.database_url, CLAIM_QUEUE, queued=CLAIM_QUEUE)
            rates = {}
            for workers in CLAIM_WORKERS:
                progress(f"api, {name}: claim and complete with {workers} worker(s)")
                rates[workers] = _claims(server, workers, budget.seconds_once)
            (one, _, _), (many, latencies, errors) = rates[1], rates[CLAIM_WORKERS[-1]]
            p50, p99 = percentile(latencies, 50), percentile(latencies, 99)
            rows.append(
                Row(
                    section="api",
                    benchmark="claims/s, 8 workers vs 1",
                    configuration=f"{name}, claim then complete: claim p50 {p50:.0f} ms, "
                    f"p99 {p99:.0f} ms" + (f", {errors} workers FAILED" if errors else ""),
                    unit="claims/s",
                    measured=many,
                    baseline=one,
                    ratio=many / one if one else None,
                    params={"database": database, "p50_ms": p50, "p99_ms": p99},
                )
            )
    return rows


def measure(quick: bool, databases: Sequence[str] = DATABASES) -> list[Row]:
    budget = QUICK if quick else FULL
    rows: list[Row] = []
    for database in databases:
        rows += measure_database(database, budget)
    return rows
