"""Spot checks' cost: what replaying K=3 random segments of a finished run costs against the
run itself, and what keeping its checkpoints for them costs in storage.

A real `repro serve` on SQLite with two worker agents, each with its own token: one trains,
the other replays (a replay never goes to the trainer's token). Two runs of a dense
classifier (64 features, 512x512, batch 256): 10 epochs with an epoch checkpoint each
(segments of one epoch), and the same with step checkpoints every 50 steps (segments of 50
steps). The share is the replays' training seconds over the run's, as the jobs report them
(targets: <= 35% and <= 10%); the wall-clock share, start-up of each replay's process
included, is given beside it. Storage: the checkpoint bytes the run keeps under `all`, and
what `every:N` would keep of them."""

from __future__ import annotations

import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks import replicas
from benchmarks.rounds import progress
from benchmarks.rows import Row, render_table
from benchmarks.servers import api_server, stop_on_sigterm, worker_agent

SEGMENTS = 3
EPOCH_TARGET, STEP_TARGET = 0.35, 0.10
EVERY_STEPS = 50
# An operator keeping step checkpoints for spot checks lets a run hold them all: 80 step
# checkpoints of two files (the default of 64 files thins them, doubling the segments).
KEEPS_ALL = {"REPRO_MAX_RUN_ARTIFACT_FILES": "400"}
THINNED = 5  # every:N shown for storage


def spec(*, epochs: int, batches: int, every_steps: int | None = None) -> dict[str, Any]:
    """The replicas section's dense classifier (64 features, 10 classes, batch 256), wider."""
    case = replicas.spec(replicas=1, batches=batches, epochs=epochs, every=every_steps)
    case["name"] = f"bench-spot-check-{'steps' if every_steps else 'epochs'}"
    case["model"]["params"]["hidden"] = [512, 512]
    del case["distribution"]
    return case


def _wait(client: Any, path: str, done: Any, timeout: float = 1800) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found: dict[str, Any] = client.get(path).json()
        if done(found):
            return found
        time.sleep(0.5)
    raise TimeoutError(f"{path} not done after {timeout} s")


def _checked(service: Any, case: dict[str, Any]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Train the case on the trainer, spot-check it; the report and the run's artifacts."""
    client = service.client
    created = client.post("/api/v1/experiments", json=case)
    run_id = created.json()["run"]["id"]
    run = _wait(client, f"/api/v1/runs/{run_id}", lambda r: r["status"] != "queued" and
                r["status"] != "running")  # fmt: skip
    if run["status"] != "succeeded":
        raise RuntimeError(f"{case['name']}: run {run_id} {run['status']}: {run['error']}")
    asked = client.post(f"/api/v1/runs/{run_id}/spot-checks", json={"segments": SEGMENTS})
    if asked.status_code != 202:
        raise RuntimeError(f"spot check refused: {asked.text}")
    check = _wait(client, f"/api/v1/spot-checks/{asked.json()['id']}",
                  lambda c: c["status"] != "pending")  # fmt: skip
    if check["status"] != "verified":
        raise RuntimeError(f"spot check of run {run_id}: {check['status']}: {check['report']}")
    files = client.get(f"/api/v1/runs/{run_id}/artifacts").json()
    return check["report"], [f for f in files if f["kind"] == "checkpoint"]


def _share_row(report: dict[str, Any], *, what: str, target: float, config: str) -> Row:
    cost = report["cost"]
    share = float(cost["training_share"])
    met = share <= target
    return Row(
        section="spotcheck",
        benchmark=f"spot check K={SEGMENTS}, {what}: replays' share of training",
        configuration=f"{config}; wall clock with each replay's start-up: {cost['share']:.0%}",
        unit="s",
        measured=float(cost["replay_training_seconds"]),
        baseline=float(cost["run_training_seconds"]),
        ratio=share,
        target=f"<= {target:.2f}",
        met=met,
        cause="" if met else "segments are few and long next to the run: keep more checkpoints",
        params={"segments_total": report["segments_total"], "wall_share": cost["share"]},
    )


def _storage_rows(files: list[dict[str, Any]], config: str) -> list[Row]:
    from service.runs.resume_points import kept_positions

    stems: dict[str, int] = {}
    for f in files:
        stems[f["name"].rsplit(".", 1)[0]] = stems.get(f["name"].rsplit(".", 1)[0], 0) + f["size"]
    ordered = sorted(stems.items(), key=lambda kv: (int(kv[0].split("-")[1]) *
                     (1 if kv[0].startswith("step") else 10**9), kv[0]))  # fmt: skip
    everything = sum(stems.values())
    kept = kept_positions(len(ordered), f"every:{THINNED}")
    thinned = sum(size for i, (_, size) in enumerate(ordered) if i in kept)
    return [
        Row(
            section="spotcheck",
            benchmark="checkpoints kept per run: all",
            configuration=f"{config}; {len(ordered)} checkpoints",
            unit="MB",
            measured=everything / 1e6,
            baseline=None,
            ratio=None,
        ),
        Row(
            section="spotcheck",
            benchmark=f"checkpoints kept per run: every:{THINNED} against all",
            configuration=f"{config}; {len(kept)} of {len(ordered)} checkpoints",
            unit="MB",
            measured=thinned / 1e6,
            baseline=everything / 1e6,
            ratio=thinned / everything if everything else None,
        ),
    ]


def measure(quick: bool) -> list[Row]:
    epochs, batches = (4, 50) if quick else (10, 400)
    config = f"mlp 512x512, batch 256, {epochs} epochs of {batches} steps"
    rows: list[Row] = []
    with (
        tempfile.TemporaryDirectory(prefix="reprotrain-bench-spot-") as tmp,
        api_server("sqlite", Path(tmp) / "api", env=KEEPS_ALL) as server,
        worker_agent(server, Path(tmp) / "trainer", "trainer"),
        worker_agent(server, Path(tmp) / "checker", "checker"),
    ):
        progress("spot checks: training 2 runs, replaying 3 segments of each")
        by_epoch, files = _checked(server.service, spec(epochs=epochs, batches=batches))
        by_step, step_files = _checked(
            server.service, spec(epochs=epochs, batches=batches, every_steps=EVERY_STEPS)
        )
    rows.append(_share_row(by_epoch, what="1-epoch segments", target=EPOCH_TARGET, config=config))
    rows.append(
        _share_row(
            by_step,
            what=f"{EVERY_STEPS}-step segments",
            target=STEP_TARGET,
            config=f"{config}, step checkpoints every {EVERY_STEPS}",
        )
    )
    rows += _storage_rows(files, config)
    rows += _storage_rows(step_files, f"{config}, step checkpoints every {EVERY_STEPS}")
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    """Run the section on its own and print its rows."""
    stop_on_sigterm()
    print(render_table(measure("--quick" in (argv or sys.argv[1:]))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
