"""A bounded load test of the API: a closed loop of mixed reads and submissions.

Starts its own server (`repro serve --no-demo`) on a private PostgreSQL server or a SQLite
data directory in a temporary directory, seeds experiments, then keeps `--concurrency`
requests in flight for `--duration` seconds: about 70% reads (a page of runs, one run, one
experiment) and 30% submissions with fresh Idempotency-Keys. The load comes from separate
processes so that the client's Python does not compete with the server's for one GIL.
Prints requests, throughput, error rate and latency percentiles per kind of request; exits
1 if any request failed (a non-2xx status or a transport error). Cleans up after itself.

    .venv/bin/python -m benchmarks.load_api
    ... -m benchmarks.load_api --database sqlite --duration 60 --json load.json

The same load processes serve `python -m benchmarks` (section 5), one kind of request at a
time; `Plan.kinds` says which.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import platform
import random
import re
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from functools import cache
from pathlib import Path
from typing import Any

import httpx

from benchmarks.servers import api_server, stop_on_sigterm

REPO = Path(__file__).resolve().parents[1]
READ_SHARE = 0.7
KINDS = ("list_runs", "get_run", "get_experiment", "submit")
WEIGHTS = (READ_SHARE / 3, READ_SHARE / 3, READ_SHARE / 3, 1 - READ_SHARE)
# What each kind of request is, for tables.
REQUESTS = {
    "healthz": "GET /healthz",
    "list_runs": "GET /runs?limit=50",
    "get_run": "GET /runs/{id}",
    "get_experiment": "GET /experiments/{id}",
    "submit": "POST /experiments",
}
TRANSPORT_ERROR = 0  # the status recorded when no HTTP answer came back
REQUEST_TIMEOUT = 30.0
# A runaway bound only: no thread gets near this in the longest allowed duration.
MAX_REQUESTS_PER_THREAD = 1_000_000
MAX_DURATION = 3600.0
ERROR_SAMPLES = 5


@cache
def _spec_text() -> str:
    return (REPO / "examples" / "seed001.yaml").read_text()


def spec_named(name: str) -> str:
    body, replaced = re.subn(r"(?m)^name: .*$", f"name: {name}", _spec_text())
    if replaced != 1:
        raise RuntimeError("examples/seed001.yaml has no top-level name line")
    return body


# -- the load generator (runs in its own processes) -----------------------------------------


@dataclass(frozen=True)
class Plan:
    """What one load process does; plain data, so it pickles across the spawn."""

    url: str
    token: str
    run_ids: tuple[int, ...]
    experiment_ids: tuple[int, ...]
    threads: int
    duration: float
    seed: int
    process_index: int
    kinds: tuple[str, ...] = KINDS
    weights: tuple[float, ...] = WEIGHTS


@dataclass
class Outcome:
    """What one load process measured: (index into Plan.kinds, status, seconds) per request."""

    records: list[tuple[int, int, float]]
    elapsed: float
    error_samples: list[str]
    cpu_seconds: float = 0.0  # the load process's own CPU time (user + system) meanwhile


def _one_request(
    client: httpx.Client, plan: Plan, kind: str, rng: random.Random, name: str
) -> httpx.Response:
    if kind == "healthz":
        return client.get("/healthz")
    if kind == "list_runs":
        return client.get("/api/v1/runs", params={"limit": 50})
    if kind == "get_run":
        return client.get(f"/api/v1/runs/{rng.choice(plan.run_ids)}")
    if kind == "get_experiment":
        return client.get(f"/api/v1/experiments/{rng.choice(plan.experiment_ids)}")
    return client.post(
        "/api/v1/experiments",
        content=spec_named(name),
        headers={"Content-Type": "application/yaml", "Idempotency-Key": str(uuid.uuid4())},
    )


def _client_thread(
    plan: Plan,
    thread_index: int,
    deadline: float,
    records: list[tuple[int, int, float]],
    errors: list[str],
    ended: list[float],
) -> None:
    rng = random.Random(plan.seed * 10_007 + plan.process_index * 101 + thread_index)
    headers = {"Authorization": f"Bearer {plan.token}"}
    mine: list[tuple[int, int, float]] = []
    with httpx.Client(base_url=plan.url, headers=headers, timeout=REQUEST_TIMEOUT) as client:
        for n in range(MAX_REQUESTS_PER_THREAD):
            if time.perf_counter() >= deadline:
                break
            kind_index = rng.choices(range(len(plan.kinds)), weights=plan.weights)[0]
            kind = plan.kinds[kind_index]
            name = f"load-{plan.seed}-{plan.process_index}-{thread_index}-{n}"
            began = time.perf_counter()
            try:
                response = _one_request(client, plan, kind, rng, name)
                status = response.status_code
                if not 200 <= status < 300 and len(errors) < ERROR_SAMPLES:
                    errors.append(f"{kind}: {status} {response.text[:300]}")
            except httpx.TransportError as exc:
                status = TRANSPORT_ERROR
                if len(errors) < ERROR_SAMPLES:
                    errors.append(f"{kind}: {type(exc).__name__}: {exc}")
            mine.append((kind_index, status, time.perf_counter() - began))
    records.extend(mine)  # list.extend is atomic under the GIL
    ended.append(time.perf_counter())


def load_process(plan: Plan, start: Any, results: Any) -> None:
    """Entry point of a load process: wait for the common start, load, report."""
    records: list[tuple[int, int, float]] = []
    errors: list[str] = []
    ended: list[float] = []
    start.wait(timeout=120)  # every process starts the clock together
    began, cpu_began = time.perf_counter(), time.process_time()
    deadline = began + plan.duration
    threads = [
        threading.Thread(
            target=_client_thread,
            args=(plan, i, deadline, records, errors, ended),
            name=f"load-{i}",
            daemon=True,
        )
        for i in range(plan.threads)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=plan.duration + REQUEST_TIMEOUT + 30)
    elapsed = (max(ended) if ended else time.perf_counter()) - began
    cpu = time.process_time() - cpu_began
    results.put(Outcome(records=records, elapsed=elapsed, error_samples=errors, cpu_seconds=cpu))


# -- the server's side ----------------------------------------------------------------------


def seed(service: Any, count: int) -> tuple[list[int], list[int]]:
    """Submit `count` experiments; their experiment ids and run ids."""
    experiment_ids, run_ids = [], []
    for i in range(count):
        created = service.submit(spec_named(f"seed-{i}"), **{"Idempotency-Key": f"seed-{i}"})
        if created.status_code != 201:
            raise RuntimeError(f"seeding failed: {created.status_code} {created.text[:500]}")
        experiment_ids.append(created.json()["experiment"]["id"])
        run_ids.append(created.json()["run"]["id"])
    return experiment_ids, run_ids


def cpu_seconds(pid: int) -> float | None:
    """User plus system CPU time of a process (Linux), to show where the time went."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def context_switches(pid: int) -> int | None:
    """Context switches, voluntary and not, of a process's live threads so far (Linux):
    a thread that gives up its core to wait (for the GIL, a lock, a socket) adds one."""
    total, found = 0, False
    for status in Path(f"/proc/{pid}/task").glob("*/status"):
        try:
            lines = status.read_text().splitlines()
        except OSError:
            continue  # the thread ended meanwhile
        for line in lines:
            if line.startswith(("voluntary_ctxt_switches", "nonvoluntary_ctxt_switches")):
                total += int(line.split()[1])
                found = True
    return total if found else None


# -- figures --------------------------------------------------------------------------------


@dataclass
class Figures:
    kind: str
    requests: int
    rps: float
    errors: int
    error_rate: float
    p50_ms: float
    p95_ms: float
    p99_ms: float
    max_ms: float
    server_cpu_ms: float | None = None  # the server's CPU time per request, when measured
    database_cpu_ms: float | None = None  # a PostgreSQL server's (every backend), likewise
    server_switches: float | None = None  # the server's context switches per request
    client_cpu_ms: float | None = None  # the load processes' CPU time per request


def percentile(ordered: Sequence[float], q: float) -> float:
    """Nearest-rank percentile of sorted values (0 for none)."""
    if not ordered:
        return 0.0
    rank = max(1, min(len(ordered), round(q / 100 * len(ordered) + 0.5)))
    return ordered[rank - 1]


def figures(kind: str, records: list[tuple[int, int, float]], elapsed: float) -> Figures:
    latencies = sorted(seconds * 1000 for _, _, seconds in records)
    errors = sum(1 for _, status, _ in records if not 200 <= status < 300)
    return Figures(
        kind=kind,
        requests=len(records),
        rps=len(records) / elapsed if elapsed > 0 else 0.0,
        errors=errors,
        error_rate=errors / len(records) if records else 0.0,
        p50_ms=percentile(latencies, 50),
        p95_ms=percentile(latencies, 95),
        p99_ms=percentile(latencies, 99),
        max_ms=latencies[-1] if latencies else 0.0,
    )


def table(rows: list[Figures]) -> str:
    header = (
        f"{'kind':<15}{'requests':>10}{'rps':>9}{'errors':>8}{'err %':>8}"
        f"{'p50 ms':>9}{'p95 ms':>9}{'p99 ms':>9}{'max ms':>9}"
    )
    lines = [header, "-" * len(header)]
    for r in rows:
        lines.append(
            f"{r.kind:<15}{r.requests:>10}{r.rps:>9.1f}{r.errors:>8}{r.error_rate * 100:>8.2f}"
            f"{r.p50_ms:>9.1f}{r.p95_ms:>9.1f}{r.p99_ms:>9.1f}{r.max_ms:>9.1f}"
        )
    return "\n".join(lines)


# -- main -----------------------------------------------------------------------------------


def run_load(
    plans: Sequence[Any], timeout: float, target: Callable[[Any, Any, Any], None] = load_process
) -> list[Any]:
    """Run one load process per plan to the end (all start together); their outcomes."""
    ctx = multiprocessing.get_context("spawn")  # no fork of a process holding server handles
    start = ctx.Barrier(len(plans) + 1)
    results = ctx.Queue()
    procs = [ctx.Process(target=target, args=(p, start, results), daemon=True) for p in plans]
    try:
        for proc in procs:
            proc.start()
        start.wait(timeout=120)
        # Drain before joining: a child cannot exit while its big result sits in the pipe.
        outcomes = [results.get(timeout=timeout) for _ in procs]
        for proc in procs:
            proc.join(timeout=30)
        return outcomes
    finally:
        for proc in procs:
            if proc.is_alive():
                proc.terminate()
                proc.join(timeout=10)
        results.close()
        results.join_thread()


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=120.0, help="seconds of load")
    parser.add_argument("--concurrency", type=int, default=16, help="requests in flight")
    parser.add_argument("--database", choices=("sqlite", "postgresql"), default="postgresql")
    parser.add_argument(
        "--processes",
        type=int,
        default=2,
        help="load generator processes; the concurrency is split over them",
    )
    parser.add_argument("--seed-experiments", type=int, default=200)
    parser.add_argument("--quick", action="store_true", help="a 10 s smoke run")
    parser.add_argument("--json", type=Path, metavar="PATH", help="also write the figures here")
    args = parser.parse_args(argv)
    if args.quick:
        args.duration = 10.0
    if not 0 < args.duration <= MAX_DURATION:
        parser.error(f"--duration must be in (0, {MAX_DURATION:.0f}]")
    if args.concurrency < 1 or args.processes < 1 or args.seed_experiments < 1:
        parser.error("--concurrency, --processes and --seed-experiments must be at least 1")
    args.processes = min(args.processes, args.concurrency)
    return args


def split_threads(concurrency: int, processes: int) -> list[int]:
    """Threads per process: the concurrency split as evenly as it goes."""
    return [concurrency // processes + (i < concurrency % processes) for i in range(processes)]


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    stop_on_sigterm()
    split = split_threads(args.concurrency, args.processes)
    with tempfile.TemporaryDirectory(prefix="reprotrain-load-") as tmp:
        began = time.monotonic()
        with api_server(args.database, Path(tmp)) as server:
            service = server.service
            print(
                f"{args.database}: server up in {time.monotonic() - began:.1f} s; seeding "
                f"{args.seed_experiments} experiments…",
                file=sys.stderr,
            )
            experiment_ids, run_ids = seed(service, args.seed_experiments)
            token = service.token("submitter", "load")
            plans = [
                Plan(
                    url=service.url,
                    token=token,
                    run_ids=tuple(run_ids),
                    experiment_ids=tuple(experiment_ids),
                    threads=threads,
                    duration=args.duration,
                    seed=20240611,
                    process_index=i,
                )
                for i, threads in enumerate(split)
            ]
            print(
                f"load: {args.concurrency} in flight from {args.processes} process(es) "
                f"for {args.duration:.0f} s…",
                file=sys.stderr,
            )
            cpu_before = cpu_seconds(service.proc.pid)
            outcomes = run_load(plans, timeout=args.duration + REQUEST_TIMEOUT + 120)
            cpu_after = cpu_seconds(service.proc.pid)
            log_tail = service.log.read_text(errors="replace")[-3000:]

    elapsed = max(o.elapsed for o in outcomes)
    records = [r for o in outcomes for r in o.records]
    rows = [
        figures(kind, [r for r in records if r[0] == i], elapsed) for i, kind in enumerate(KINDS)
    ]
    rows.append(figures("all", records, elapsed))
    total = rows[-1]
    server_cpu = (
        (cpu_after - cpu_before) / elapsed
        if cpu_before is not None and cpu_after is not None
        else None
    )
    print(
        f"\n{args.database}, {args.concurrency} in flight, {elapsed:.1f} s, "
        f"{os.cpu_count()} CPUs, Python {platform.python_version()}"
        + (f", API server CPU {server_cpu * 100:.0f}%" if server_cpu is not None else "")
    )
    print(table(rows))
    errors = [e for o in outcomes for e in o.error_samples]
    if errors:
        print("\nerrors (samples):\n  " + "\n  ".join(errors[:ERROR_SAMPLES]))
        print(f"\nserver log (tail):\n{log_tail}")
    if args.json is not None:
        report = {
            "database": args.database,
            "concurrency": args.concurrency,
            "processes": args.processes,
            "duration_s": elapsed,
            "seed_experiments": args.seed_experiments,
            "cpus": os.cpu_count(),
            "server_cpu_share": server_cpu,
            "kinds": {r.kind: asdict(r) for r in rows},
            "error_samples": errors,
        }
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return 0 if total.errors == 0 and total.requests > 0 else 1


if __name__ == "__main__":
    sys.exit(main())
