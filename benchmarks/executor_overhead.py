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
or image the section reports nothing.
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


def _one_job(executor: Any, workdir: Path) -> dict[str, Any]:
    from tests.integration.jobs import job_request
    from worker.training.progress import parse_line

    shutil.rmtree(workdir, ignore_errors=True)
    request = job_request(workdir, yaml.safe_load(SPEC.read_text()), "bench", None)
    began = time.perf_counter()
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
    }


def _docker_executor() -> Any | None:
    try:
        from worker.node.executors import ExecutorUnavailable, make_executor

        return make_executor("docker", images=[IMAGE])
    except ExecutorUnavailable as exc:
        progress(f"executors: no docker measurement ({exc})")
        return None


def measure(quick: bool) -> list[Row]:
    """The section's rows (none without a Docker engine and the CPU worker image)."""
    from worker.node.executors import make_executor

    docker = _docker_executor()
    if docker is None:
        return []
    sides = [Side("process", make_executor("process")), Side("docker", docker)]
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
    return [_row(process, container, quick)]


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
