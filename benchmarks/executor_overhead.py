"""Container start-to-first-step: the docker executor against the process executor.

Both executors start the same small spec (examples/seed001.yaml) as the agent would, in
alternating order, round after round; each side keeps its best round (on a shared machine
noise only adds time). Measured from the executor's `start()` call to the job's first
`step` progress line, and taken apart with what the executor and the job saw:

- start(): for the docker executor, creating the container, handing the workspace to the
  job user and starting it (namespaces, the overlay mount, cgroup limits); for the process
  executor, fork and exec;
- the job's own start-up (`timings.startup`: interpreter, imports of TensorFlow and the
  runtime, until the job announced `started`), inside the container or not;
- the rest until the first step: building the model and the first traced step.

Information only, no target: the image must be built (docker/build.sh); without an engine
or image there is no docker row.

Beside it, claim to first step with and without a warm start (the process executor keeps
the next job's interpreter started while the worker is idle): measured from laying out the
claimed run's workspace, as the agent does, to the first `step` line, with the warm
interpreter's imports finished, as on an idle worker. Target: at most 3 s warm; the cold
start is the information beside it.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from benchmarks.rounds import progress
from benchmarks.rows import Row
from benchmarks.servers import REPO

SPEC = REPO / "examples" / "seed001.yaml"
IMAGE = "reprotrain-worker-cpu:0.1.0"


@dataclass
class Side:
    name: str
    executor: Any
    rounds: list[dict[str, Any]] = field(default_factory=list)

    def best(self) -> dict[str, Any]:
        return min(self.rounds, key=lambda r: float(r["first_step"]))


def _one_job(executor: Any, workdir: Path, *, from_claim: bool = False) -> dict[str, Any]:
    from tests.integration.jobs import job_request
    from worker.training.progress import parse_line

    shutil.rmtree(workdir, ignore_errors=True)
    claimed = time.perf_counter()
    request = job_request(workdir, yaml.safe_load(SPEC.read_text()), "bench", None)
    began = claimed if from_claim else time.perf_counter()
    handle = executor.start(request)
    started = time.perf_counter() - began
    first_step = None
    try:
        for line in handle.stderr_lines():
            event = parse_line(line)
            if first_step is None and event is not None and event["event"] == "step":
                first_step = time.perf_counter() - began
        code = handle.wait()
    finally:
        handle.close()
    result = json.loads(request.result_path.read_text())
    if code != 0 or result["status"] != "succeeded" or first_step is None:
        raise RuntimeError(f"{executor.kind} job failed ({code}): {result.get('error')}")
    return {
        "start": started,
        "first_step": first_step,
        "startup": float(result["timings"]["startup"]),
        "final": result["final_fingerprint"],
        "warm": bool(getattr(handle, "warm", False)),
    }


def _warm_and_cold(quick: bool, tmp: Path) -> Row:
    """Claim to first step of the process executor, warm-started against cold-started."""
    from worker.node.executors.process import ProcessExecutor

    warm = Side("warm", ProcessExecutor(warm_start=True))
    cold = Side("cold", ProcessExecutor(warm_start=False))
    rounds = 1 if quick else 3
    try:
        for i in range(rounds):
            for side in (warm, cold) if i % 2 == 0 else (cold, warm):
                if side is warm:
                    side.executor.prepare()
                    if not side.executor.wait_warm(600):
                        raise RuntimeError("the warm interpreter did not get ready")
                side.rounds.append(_one_job(side.executor, tmp / side.name, from_claim=True))
                progress(
                    f"executors: round {i + 1}/{rounds} {side.name} start: first step "
                    f"{side.rounds[-1]['first_step']:.2f} s after the claim"
                )
    finally:
        warm.executor.discard_warm()
    best_warm, best_cold = warm.best(), cold.best()
    if not best_warm["warm"] or best_cold["warm"]:
        raise RuntimeError("the warm side did not start warm, or the cold side did not start cold")
    if best_warm["final"] != best_cold["final"]:
        raise RuntimeError(f"warm and cold disagree: {best_warm['final']} != {best_cold['final']}")
    measured = round(best_warm["first_step"], 3)
    return Row(
        section="executors",
        benchmark="process executor: claim to first step, warm start",
        configuration="seed001 spec, warm interpreter ready vs fresh process" + " (quick)" * quick,
        unit="s",
        measured=measured,
        baseline=round(best_cold["first_step"], 3),
        ratio=round(best_warm["first_step"] / best_cold["first_step"], 3),
        target="<= 3 s",
        met=measured <= 3.0,
        cause=(
            f"job start-up {best_warm['startup']:.2f} s warm vs {best_cold['startup']:.2f} s cold "
            "(interpreter and TensorFlow imports); equal final fingerprints"
        ),
        params={"warm": best_warm, "cold": best_cold},
    )


def _docker_executor() -> Any | None:
    try:
        from worker.node.executors import ExecutorUnavailable, make_executor

        return make_executor("docker", images=[IMAGE])
    except ExecutorUnavailable as exc:
        progress(f"executors: no docker measurement ({exc})")
        return None


def measure(quick: bool) -> list[Row]:
    """The section's rows: warm against cold start, and docker against process executor
    (no such row without a Docker engine and the CPU worker image)."""
    from worker.node.executors import make_executor

    with tempfile.TemporaryDirectory(prefix="bench-warm-") as tmp:
        rows = [_warm_and_cold(quick, Path(tmp))]
    docker = _docker_executor()
    if docker is None:
        return rows
    # Cold, as the docker executor always starts: the same start for both.
    sides = [Side("process", make_executor("process", warm_start=False)), Side("docker", docker)]
    # Best of 2 per side: a start-up time, whose best is stable within a few percent.
    rounds = 1 if quick else 2
    with tempfile.TemporaryDirectory(prefix="bench-executors-") as tmp:
        for i in range(rounds):
            order = sides if i % 2 == 0 else sides[::-1]
            for side in order:
                side.rounds.append(_one_job(side.executor, Path(tmp) / side.name))
                progress(
                    f"executors: round {i + 1}/{rounds} {side.name}: first step after "
                    f"{side.rounds[-1]['first_step']:.2f} s"
                )
    process, container = (side.best() for side in sides)
    if process["final"] != container["final"]:
        raise RuntimeError(f"executors disagree: {process['final']} != {container['final']}")
    return [*rows, _row(process, container, quick)]


def _row(process: dict[str, Any], container: dict[str, Any], quick: bool) -> Row:
    def part(key: str) -> Callable[[dict[str, Any]], float]:
        return lambda r: float(r[key])

    start, startup = part("start"), part("startup")

    def rest(r: dict[str, Any]) -> float:
        return float(r["first_step"]) - start(r) - startup(r)

    overhead = container["first_step"] - process["first_step"]
    cause = (
        f"+{overhead:.2f} s: start() {start(container):.2f} s vs {start(process):.2f} s "
        "(create, chown the workspace, start: namespaces, overlay mount, cgroup); job "
        f"start-up {startup(container):.2f} s vs {startup(process):.2f} s (interpreter and "
        "TensorFlow imports, read from the image's layers); model and first step "
        f"{rest(container):.2f} s vs {rest(process):.2f} s; equal final fingerprints"
    )
    return Row(
        section="executors",
        benchmark="docker executor: start to first step",
        configuration="seed001 spec, fresh container vs fresh process" + " (quick)" * quick,
        unit="s",
        measured=round(container["first_step"], 3),
        baseline=round(process["first_step"], 3),
        ratio=round(container["first_step"] / process["first_step"], 3),
        cause=cause,
        params={"image": IMAGE, "docker": container, "process": process},
    )
