"""A job's training speed against plain Keras `model.fit` on the same model and data.

For each built-in architecture (the small specs of training_cost.py), in fresh processes:

- measured: `python -m worker.run` with everything on (op determinism, a trace point at
  every epoch end, data fingerprints), steps per second of its best epoch after the first,
  from the job's own per-epoch timing (which includes the epoch's trace point).
- baselines: the same model (built by the same architecture with the same seed) compiled
  with the same optimizer, loss and metrics and trained by `model.fit` on an equivalent
  tf.data pipeline (batch ids -> parallel map of the same generator -> prefetch), steps per
  second of its best epoch after the first, timed by a callback:
  (a) op determinism on, (b) op determinism off, (c) op determinism on and
  `steps_per_execution=K`, Keras's several steps per compiled call.
- measured too: the job with `training.steps_per_execution: K` in its spec, against (c).
- whole process: each side's wall time from start to exit (a job's includes its
  verification: trace points, data fingerprints, provenance), the best process of each.

Two processes per case (one in a quick run), in the order job, job with K, (a), (b), (c),
then the reverse, and each case's faster process counts: on a 2-core machine a single
process now and then ran a third slower through every epoch (an `mlp` job at 288 steps/s,
488 in the next process), which one process per case turned into a miss or a win of that
size. Targets: the job >= 1.0 of (a) and of (b); the job with K >= 1.0 of (c) for the MLP
and the small CNN (information for the token models); each whole process >= 0.95 of its
`model.fit` script's (fit's wall time over the job's). The training
section (determinism on vs off, trace share) reads the faster job and (a) and (b) from
SHARED_JOBS and SHARED_FIT instead of starting more processes.

    .venv/bin/python -m benchmarks --only keras
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from benchmarks.rounds import progress
from benchmarks.rows import Row
from benchmarks.training_cost import (
    REPO,
    SHARED_FIT,
    SHARED_JOBS,
    job_env,
    run_job,
    specs,
    trained,
    with_determinism,
)

TARGET = 1.0
WALL_TARGET = 0.95
STEPS_PER_EXECUTION = 20
# Models whose job with several steps per call has a target against model.fit's.
LOOPED_TARGETED = ("mlp", "small_cnn")
FIT_MODES = {
    "fit": "model.fit, op determinism on",
    "fit_nondeterministic": "model.fit, op determinism off",
    "fit_steps_per_execution": f"model.fit(steps_per_execution={STEPS_PER_EXECUTION}), "
    "op determinism on",
}


@dataclass
class Speed:
    steps_per_s: float  # best epoch after the first
    median_steps_per_s: float
    epoch_s: float  # that best epoch's length
    wall_s: float = 0.0  # the whole process, start to exit


def _speed(steps: Sequence[int], seconds: Sequence[float]) -> Speed:
    rates = sorted((n / s, s) for i, (n, s) in enumerate(zip(steps, seconds, strict=True)) if i > 0)
    if not rates:
        raise RuntimeError("a spec needs at least two epochs to time one after compilation")
    best, epoch_s = rates[-1]
    return Speed(best, rates[len(rates) // 2][0], epoch_s)


def fit_child(spec_path: Path, mode: str, out: Path) -> None:
    """Train the spec's model with `model.fit` in this process and write its epoch times."""
    import keras
    import tensorflow as tf

    from worker.models import registry
    from worker.spec import load_training_spec
    from worker.training.job import Job
    from worker.training.seeds import resolve_seed

    spec = load_training_spec(spec_path)
    deterministic = mode != "fit_nondeterministic"
    spec = spec.model_copy(
        update={
            "determinism": spec.determinism.model_copy(update={"op_determinism": deterministic})
        }
    )
    seed = resolve_seed(spec.seed)
    if deterministic:
        tf.config.experimental.enable_op_determinism()
    keras.utils.set_random_seed(seed[0])
    job = Job(spec, seed)  # the job's own model, optimizer, loss and generator
    data = job.data
    # A plain pipeline, as a Keras user would write it around the same generator.
    dataset = (
        tf.data.Dataset.range(data.num_batches)
        .map(data.make_batch, num_parallel_calls=tf.data.AUTOTUNE)
        .prefetch(tf.data.AUTOTUNE)
    )
    metrics = [
        getattr(keras.metrics, registry.METRICS[name])(name=name) for name in spec.training.metrics
    ]
    job.model.compile(
        optimizer=job.optimizer,
        loss=job.loss_fn,
        metrics=metrics,
        steps_per_execution=STEPS_PER_EXECUTION if mode == "fit_steps_per_execution" else 1,
    )
    seconds: list[float] = []

    class EpochTimer(keras.callbacks.Callback):  # type: ignore[misc]
        def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
            self.start = time.perf_counter()

        def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
            seconds.append(time.perf_counter() - self.start)

    job.model.fit(dataset, epochs=spec.training.epochs, verbose=0, callbacks=[EpochTimer()])
    out.write_text(json.dumps({"seconds": seconds, "steps_per_epoch": data.num_batches}))


def run_fit(spec: dict[str, Any], mode: str, workdir: Path, timeout: float = 300) -> Speed:
    """`model.fit` of a spec in a fresh process; the speed of its best epoch after the first."""
    workdir.mkdir(parents=True, exist_ok=True)
    spec_path, out = workdir / "spec.json", workdir / "fit.json"
    spec_path.write_text(json.dumps(spec))
    started = time.monotonic()
    done = subprocess.run(
        [
            *(sys.executable, "-m", "benchmarks.keras_baseline"),
            *("--fit", str(spec_path), "--mode", mode, "--out", str(out)),
        ],
        env=job_env(),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    wall = time.monotonic() - started
    if done.returncode != 0 or not out.exists():
        raise RuntimeError(f"{spec['name']} {mode} failed: {done.stderr[-2000:]}")
    doc = json.loads(out.read_text())
    speed = _speed([doc["steps_per_epoch"]] * len(doc["seconds"]), doc["seconds"])
    return replace(speed, wall_s=wall)


@dataclass
class JobSpeed:
    speed: Speed
    per_point_s: float  # time per trace point
    steps_per_call: float | None  # steps per compiled train call, when the job reports calls


def job_speed(result: dict[str, Any]) -> JobSpeed:
    """A job's speed (best epoch after the first), its time per trace point, steps per call."""
    t = trained(result)
    steps, seconds, previous = [], [], 0
    for row in result["metrics"]:
        steps.append(row["step"] - previous)
        seconds.append(row["seconds"])
        previous = row["step"]
    points = len(result.get("trace") or []) or t.epochs + 1
    calls = result["timings"].get("train_calls")
    return JobSpeed(
        _speed(steps, seconds),
        t.fingerprinting_s / points,
        previous / calls if calls else None,
    )


def _cause(job: JobSpeed, fit: Speed, steps: int, fit_steps_per_call: int) -> str:
    """Where the job's best epoch spends the time `model.fit`'s best epoch does not."""
    gap = job.speed.epoch_s - fit.epoch_s
    rest = gap - job.per_point_s
    calls = (
        f"{job.steps_per_call:.1f} steps per compiled call"
        if job.steps_per_call
        else "one compiled call per step, each batch taken by a Python next()"
    )
    return (
        f"the job's best epoch took {gap * 1e3:.0f} ms more than fit's ({fit.epoch_s * 1e3:.0f} "
        f"ms): its trace point {job.per_point_s * 1e3:.1f} ms, the rest {rest / steps * 1e6:.0f} "
        f"us per step in its step loop ({calls}; fit: {fit_steps_per_call} per call, the batch "
        "taken inside the compiled function)"
    )


JOB_KINDS = {"job": 1, "job_steps_per_execution": STEPS_PER_EXECUTION}


def _looped(spec: dict[str, Any], n: int) -> dict[str, Any]:
    """The spec with `training.steps_per_execution: n` (unchanged for 1)."""
    if n == 1:
        return spec
    return {**spec, "training": {**spec["training"], "steps_per_execution": n}}


def _run_kind(
    spec: dict[str, Any], kind: str, workdir: Path
) -> tuple[Speed, tuple[JobSpeed, dict[str, Any]] | None]:
    """One process of `kind`: its speed (with its wall time), and a job's speed and result."""
    if kind not in JOB_KINDS:
        return run_fit(spec, kind, workdir), None
    started = time.monotonic()
    result = run_job(with_determinism(_looped(spec, JOB_KINDS[kind]), True), workdir)
    job = job_speed(result)
    return replace(job.speed, wall_s=time.monotonic() - started), (job, result)


def measure(quick: bool) -> list[Row]:
    cases = specs(quick)
    kinds = [*JOB_KINDS, *FIT_MODES]
    order = kinds if quick else [*kinds, *reversed(kinds)]
    runs: dict[tuple[str, str], list[Speed]] = {}
    job_runs: dict[tuple[str, str], list[tuple[JobSpeed, dict[str, Any]]]] = {}
    with tempfile.TemporaryDirectory(prefix="reprotrain-bench-keras-") as tmp:
        for model, spec in cases.items():
            for n, kind in enumerate(order):
                progress(f"keras baseline: {model}, {kind}")
                speed, job = _run_kind(spec, kind, Path(tmp) / f"{model}-{kind}-{n}")
                runs.setdefault((model, kind), []).append(speed)
                if job is not None:
                    job_runs.setdefault((model, kind), []).append(job)
    speeds = {case: max(found, key=lambda s: s.steps_per_s) for case, found in runs.items()}
    walls = {case: min(s.wall_s for s in found) for case, found in runs.items()}
    jobs: dict[tuple[str, str], JobSpeed] = {}
    for (model, kind), found_jobs in job_runs.items():
        best_job, result = max(found_jobs, key=lambda j: j[0].speed.steps_per_s)
        jobs[model, kind] = best_job
        if kind == "job":
            SHARED_JOBS[model] = result
    for model in cases:
        for kind in ("fit", "fit_nondeterministic"):
            fit = speeds[model, kind]
            SHARED_FIT[model, kind == "fit"] = (fit.steps_per_s, fit.median_steps_per_s)
    rows = []
    for model, spec in cases.items():
        for job_kind, mode in [
            ("job", "fit"),
            ("job", "fit_nondeterministic"),
            ("job", "fit_steps_per_execution"),
            ("job_steps_per_execution", "fit_steps_per_execution"),
        ]:
            rows.append(_speed_row(model, spec, job_kind, mode, speeds, runs, jobs))
        for job_kind, mode in [
            ("job", "fit"),
            ("job_steps_per_execution", "fit_steps_per_execution"),
        ]:
            rows.append(_wall_row(model, job_kind, mode, walls, runs))
    return rows


def _job_label(kind: str) -> str:
    n = JOB_KINDS[kind]
    return "job" if n == 1 else f"job with steps_per_execution: {n}"


def _speed_row(
    model: str,
    spec: dict[str, Any],
    job_kind: str,
    mode: str,
    speeds: dict[tuple[str, str], Speed],
    runs: dict[tuple[str, str], list[Speed]],
    jobs: dict[tuple[str, str], JobSpeed],
) -> Row:
    """A job's steps/s (best epoch after the first) against one `model.fit` mode's."""
    ds = spec["dataset"]
    job, fit = speeds[model, job_kind], speeds[model, mode]
    ratio = job.steps_per_s / fit.steps_per_s
    looped = job_kind != "job"
    targeted = model in LOOPED_TARGETED if looped else mode != "fit_steps_per_execution"
    met = ratio >= TARGET if targeted else None
    fit_per_call = STEPS_PER_EXECUTION if mode == "fit_steps_per_execution" else 1
    return Row(
        section="keras",
        benchmark="job steps/s vs plain Keras",
        configuration=f"{model}, batch {ds['batch_size']} x {ds['train_batches']} "
        f"steps/epoch, {_job_label(job_kind)} vs {FIT_MODES[mode]}",
        unit="steps/s",
        measured=job.steps_per_s,
        baseline=fit.steps_per_s,
        ratio=ratio,
        target=f">= {TARGET:.2f}" if targeted else "",
        met=met,
        cause=_cause(jobs[model, job_kind], fit, ds["train_batches"], fit_per_call)
        if met is False
        else "",
        params={
            "model": model,
            "job": job_kind,
            "baseline": mode,
            "median_job": job.median_steps_per_s,
            "median_baseline": fit.median_steps_per_s,
            "job_processes_steps_per_s": [r.steps_per_s for r in runs[model, job_kind]],
            "baseline_processes_steps_per_s": [r.steps_per_s for r in runs[model, mode]],
            "trace_point_s": jobs[model, job_kind].per_point_s,
            "job_steps_per_call": jobs[model, job_kind].steps_per_call,
        },
    )


def _wall_row(
    model: str,
    job_kind: str,
    mode: str,
    walls: dict[tuple[str, str], float],
    runs: dict[tuple[str, str], list[Speed]],
) -> Row:
    """A job's whole process against a `model.fit` script's, start to exit (fit's over the
    job's: what share of fit's speed the whole job has)."""
    job, fit = walls[model, job_kind], walls[model, mode]
    ratio = fit / job
    return Row(
        section="keras",
        benchmark="whole process vs a model.fit script",
        configuration=f"{model}, {_job_label(job_kind)} vs {FIT_MODES[mode]}, "
        "start to exit, verification included",
        unit="s",
        measured=job,
        baseline=fit,
        ratio=ratio,
        target=f">= {WALL_TARGET:.2f}",
        met=ratio >= WALL_TARGET,
        cause=""
        if ratio >= WALL_TARGET
        else f"the job's process took {job - fit:.1f} s longer (see its `timings`: startup, "
        "setup, training, data fingerprints)",
        params={
            "model": model,
            "job": job_kind,
            "baseline": mode,
            "job_processes_s": [r.wall_s for r in runs[model, job_kind]],
            "baseline_processes_s": [r.wall_s for r in runs[model, mode]],
        },
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--fit", type=Path, metavar="SPEC", help="child: model.fit of a spec")
    parser.add_argument("--mode", choices=list(FIT_MODES), default="fit")
    parser.add_argument("--out", type=Path, help="child: where to write its epoch times")
    parser.add_argument("--quick", action="store_true", help="the MLP only, for a few steps")
    args = parser.parse_args(argv)
    if args.fit is not None:
        if args.out is None:
            parser.error("--fit needs --out")
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        fit_child(args.fit, args.mode, args.out)
        return 0
    from benchmarks.rows import render_table

    print(render_table(measure(args.quick)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
