"""Section 4, service overhead: `repro submit --wait` against `python -m worker.run`.

A fresh `repro serve` (SQLite) and one `repro worker` (default long-poll claims, process
executor) on this machine. Each round runs the same small spec both ways, in alternating
order, after one untimed round of each that warms the file cache:

- direct: `python -m worker.run --spec S --out R`, wall time of the process;
- service: `repro submit S --wait` as a user types it, wall time of the command, which
  submits, waits for a worker to claim and run the job, and returns when the run succeeded.

The service's time is taken apart with the run's own record (`GET /runs/{id}`): queue wait
(created to claimed), the job's `timings` (process start, setup, training with its
fingerprinting and checkpointing, data fingerprints), the rest of the job's time on the
worker until the run was reported, and the client's own time (CLI start, submission,
noticing the end). The same timings of the direct job are its baseline. Medians of rounds.

Target: overhead = service wall - direct wall <= 1.5 s + 5% of the training time.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from datetime import datetime
from pathlib import Path
from typing import Any

from benchmarks.rounds import progress
from benchmarks.rows import Row
from benchmarks.servers import REPO, api_server, worker_agent
from benchmarks.training_cost import job_env

SPEC = REPO / "examples" / "seed001.yaml"
FIXED_ALLOWANCE_S = 1.5
TRAINING_ALLOWANCE = 0.05
JOB_PARTS = ("startup", "setup", "training", "data_fingerprints")
QUEUE_WAIT = "queue wait (created -> claimed)"
CLIENT = "client: CLI start, submit, noticing the end"
REST = "rest until reported: re-exec, provenance, result, upload, report"
# What would shrink each part that only the service path has.
FIXES = {
    QUEUE_WAIT: "the idle worker's claim already waits on the server and wakes at the "
    "submission; the rest is the claim's own queries and the agent starting the job",
    CLIENT: "mostly the CLI's start: `repro` imports every command's modules before running "
    "one (NumPy through worker.compare.verdict and worker.result, uvicorn through "
    "service.cli.server: "
    "about 1 s of CPU on a busy machine); importing them inside the commands that need them "
    "would cut it. The end itself is noticed at once (`--wait` follows the run's events)",
    REST: "after the job ends the worker still uploads its last checkpoint, then reports",
}


def _direct(workdir: Path) -> tuple[float, dict[str, float]]:
    out = workdir / "result.json"
    began = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "worker.run", "--spec", str(SPEC), "--out", str(out)],
        env=job_env(),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    wall = time.perf_counter() - began
    if done.returncode != 0:
        raise RuntimeError(f"worker.run failed ({done.returncode}): {done.stderr[-2000:]}")
    timings: dict[str, float] = json.loads(out.read_text())["timings"]
    return wall, timings


def _parse_time(value: str) -> datetime:
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


def _via_service(url: str, token: str, client: Any) -> tuple[float, dict[str, float]]:
    auth = ("--api", url, "--token", token)
    began = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "service.cli", "submit", str(SPEC), "--wait", "--json", *auth],
        env=job_env(),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    wall = time.perf_counter() - began
    if done.returncode != 0:
        raise RuntimeError(f"repro submit failed ({done.returncode}): {done.stderr[-2000:]}")
    run_id = json.loads(done.stdout)["id"]
    run = client.get(f"/api/v1/runs/{run_id}").json()
    created, started, finished = (
        _parse_time(run[k]) for k in ("created_at", "started_at", "finished_at")
    )
    timings = dict(run["result_summary"]["timings"])
    timings["queue_wait"] = (started - created).total_seconds()
    timings["on_worker"] = (finished - started).total_seconds()
    timings["server_total"] = (finished - created).total_seconds()
    return wall, timings


def _median(values: list[dict[str, float]], key: str) -> float:
    return statistics.median(v.get(key, 0.0) for v in values)


def measure(quick: bool) -> list[Row]:
    # Median of 3 after the warm-up (of 4 before the 10-minute budget held more sections).
    rounds, warmup = (1, 0) if quick else (3, 1)
    direct: list[tuple[float, dict[str, float]]] = []
    service: list[tuple[float, dict[str, float]]] = []
    with ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-service-")))
        server = stack.enter_context(api_server("sqlite", tmp / "server"))
        token = server.token("submitter", "bench-submit")
        stack.enter_context(worker_agent(server, tmp / "worker"))
        for r in range(warmup + rounds):  # a warm-up round fills the file cache; not kept
            for how in ("direct", "service") if r % 2 else ("service", "direct"):
                label = f"round {r - warmup + 1} of {rounds}" if r >= warmup else "warm-up"
                progress(f"service overhead: {label}, {how}")
                if how == "direct":
                    got = _direct(tmp)
                    kept = direct
                else:
                    got = _via_service(server.url, token, server.service.client)
                    kept = service
                if r >= warmup:
                    kept.append(got)

    d_wall = statistics.median(w for w, _ in direct)
    s_wall = statistics.median(w for w, _ in service)
    d_t = [t for _, t in direct]
    s_t = [t for _, t in service]
    training = _median(s_t, "training")
    allowed = FIXED_ALLOWANCE_S + TRAINING_ALLOWANCE * training
    overhead = s_wall - d_wall

    # Each part of the service's wall time next to the same part of the direct run.
    job_s = [sum(t.get(k, 0.0) for k in JOB_PARTS) for t in s_t]
    parts: list[tuple[str, float, float | None]] = [
        (QUEUE_WAIT, _median(s_t, "queue_wait"), None),
        ("job: process start (interpreter, TensorFlow import)", *_both(s_t, d_t, "startup")),
        ("job: setup (determinism, data, model)", *_both(s_t, d_t, "setup")),
        ("job: training, including the two below", *_both(s_t, d_t, "training")),
        ("job: fingerprinting (epoch trace)", *_both(s_t, d_t, "fingerprinting")),
        ("job: checkpointing (service only)", *_both(s_t, d_t, "checkpointing")),
        ("job: data fingerprints", *_both(s_t, d_t, "data_fingerprints")),
        (
            REST,
            statistics.median(t["on_worker"] - j for t, j in zip(s_t, job_s, strict=True)),
            statistics.median(w - sum(t.get(k, 0.0) for k in JOB_PARTS) for w, t in direct),
        ),
        (
            CLIENT,
            statistics.median(w - t["server_total"] for w, t in service),
            None,
        ),
    ]
    extra = {what: s - (d or 0.0) for what, s, d in parts}
    on_job = statistics.median(job_s) - statistics.median(
        sum(t.get(k, 0.0) for k in JOB_PARTS) for t in d_t
    )
    met = overhead <= allowed
    spec_label = f"{SPEC.name}, SQLite, worker claims by long poll"
    rows = [
        Row(
            section="service",
            benchmark="service overhead",
            configuration=f"repro submit --wait vs worker.run (overhead {overhead:.2f} s), "
            + spec_label,
            unit="s",
            measured=s_wall,
            baseline=d_wall,
            ratio=s_wall / d_wall,
            target=f"overhead <= {allowed:.2f} s",
            met=met,
            cause=""
            if met
            else f"queue wait {extra[QUEUE_WAIT]:.2f} s ({FIXES[QUEUE_WAIT]}); client "
            f"{extra[CLIENT]:.2f} s ({FIXES[CLIENT]}); until reported {extra[REST]:+.2f} s; the "
            f"job itself {on_job:+.2f} s, sharing {os.cpu_count()} cores with the API server "
            "and the agent",
            params={"overhead_s": overhead, "allowed_s": allowed, "training_s": training},
        )
    ]
    for what, s, d in parts:
        rows.append(
            Row(
                section="service",
                benchmark="service wall time, part",
                configuration=what,
                unit="s",
                measured=s,
                baseline=d,
                ratio=s / d if d else None,
                params={"part": what},
            )
        )
    return rows


def _both(
    s_t: list[dict[str, float]], d_t: list[dict[str, float]], key: str
) -> tuple[float, float]:
    return _median(s_t, key), _median(d_t, key)
