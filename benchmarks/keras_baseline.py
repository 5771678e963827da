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

Two processes per targeted case (one in a quick run), in the order job, (a), (b), (c), (b),
(a), job, and each case's faster process counts: on a 2-core machine a single process
now and then ran a third slower through every epoch (an `mlp` job at 288 steps/s, 488 in
the next process), which one process per case turned into a miss or a win of that size.
Targets: the job >= 1.0 of (a) and of (b); (c) is shown for information, from one
process, which keeps the section within the whole benchmark's budget. The training
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
from dataclasses import dataclass
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
STEPS_PER_EXECUTION = 10
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
    from worker.spec import load_spec
    from worker.training.job import Job
    from worker.training.seeds import resolve_seed

    spec = load_spec(spec_path)
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
    if done.returncode != 0 or not out.exists():
        raise RuntimeError(f"{spec['name']} {mode} failed: {done.stderr[-2000:]}")
    doc = json.loads(out.read_text())
    return _speed([doc["steps_per_epoch"]] * len(doc["seconds"]), doc["seconds"])


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


def measure(quick: bool) -> list[Row]:
    cases = specs(quick)
    kinds = ["job", *FIT_MODES]
    # (c), last of the kinds, is for information: one process, in the middle.
    order = kinds if quick else [*kinds, *reversed(kinds[:-1])]
    runs: dict[tuple[str, str], list[Speed]] = {}
    job_runs: dict[str, list[tuple[JobSpeed, dict[str, Any]]]] = {}
    with tempfile.TemporaryDirectory(prefix="reprotrain-bench-keras-") as tmp:
        for model, spec in cases.items():
            for n, kind in enumerate(order):
                progress(f"keras baseline: {model}, {kind}")
                workdir = Path(tmp) / f"{model}-{kind}-{n}"
                if kind == "job":
                    result = run_job(with_determinism(spec, True), workdir)
                    job_runs.setdefault(model, []).append((job_speed(result), result))
                    speed = job_runs[model][-1][0].speed
                else:
                    speed = run_fit(spec, kind, workdir)
                runs.setdefault((model, kind), []).append(speed)
    speeds = {case: max(found, key=lambda s: s.steps_per_s) for case, found in runs.items()}
    jobs: dict[str, JobSpeed] = {}
    for model, found_jobs in job_runs.items():
        jobs[model], SHARED_JOBS[model] = max(found_jobs, key=lambda j: j[0].speed.steps_per_s)
        for kind in ("fit", "fit_nondeterministic"):
            fit = speeds[model, kind]
            SHARED_FIT[model, kind == "fit"] = (fit.steps_per_s, fit.median_steps_per_s)
    rows = []
    for model, spec in cases.items():
        ds = spec["dataset"]
        job = speeds[model, "job"]
        for mode, what in FIT_MODES.items():
            fit = speeds[model, mode]
            ratio = job.steps_per_s / fit.steps_per_s
            targeted = mode != "fit_steps_per_execution"
            met = ratio >= TARGET if targeted else None
            rows.append(
                Row(
                    section="keras",
                    benchmark="job steps/s vs plain Keras",
                    configuration=f"{model}, batch {ds['batch_size']} x {ds['train_batches']} "
                    f"steps/epoch, vs {what}",
                    unit="steps/s",
                    measured=job.steps_per_s,
                    baseline=fit.steps_per_s,
                    ratio=ratio,
                    target=f">= {TARGET:.2f}" if targeted else "",
                    met=met,
                    cause=_cause(
                        jobs[model],
                        fit,
                        ds["train_batches"],
                        STEPS_PER_EXECUTION if mode == "fit_steps_per_execution" else 1,
                    )
                    if met is False
                    else "",
                    params={
                        "model": model,
                        "baseline": mode,
                        "median_job": job.median_steps_per_s,
                        "median_baseline": fit.median_steps_per_s,
                        "job_processes_steps_per_s": [r.steps_per_s for r in runs[model, "job"]],
                        "baseline_processes_steps_per_s": [
                            r.steps_per_s for r in runs[model, mode]
                        ],
                        "trace_point_s": jobs[model].per_point_s,
                        "job_steps_per_call": jobs[model].steps_per_call,
                    },
                )
            )
    return rows


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
