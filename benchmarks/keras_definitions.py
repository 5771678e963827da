"""ResNet-20 as a stored model definition: a job's steps/s against `model.fit`.

The definition is examples/models/resnet20.json, the data a CIFAR-shaped array dataset
(examples/models/make_datasets.py), 32x32x3 at batch 128. Each side runs in a fresh
process, as in keras_baseline.py:

- measured: `python -m worker.run --dataset-file D --model-file M --checkpoint-dir C` with
  everything on (op determinism, a trace point and a checkpoint at every epoch end, data
  fingerprints); steps per second of its best epoch after the first; and the same job with
  `training.steps_per_execution: K`.
- baseline: the same model (the job's own, loaded from the same definition with the same
  seed) compiled with the same optimizer, loss and metrics and trained by `model.fit` on a
  plain tf.data pipeline over the same generator, op determinism on; and with
  `steps_per_execution=K`.

Rows: the job against `model.fit` (information); the job with K against `model.fit` with K
(>= 1.0); each whole process against its `model.fit` script's (>= 0.95, fit's wall time over
the job's); verification's share of the job's training time: its trace points, checkpoints
and data fingerprints (<= 3%).

    .venv/bin/python -m benchmarks.keras_definitions [--quick]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.keras_baseline import (
    STEPS_PER_EXECUTION,
    TARGET,
    WALL_TARGET,
    Speed,
    _speed,
    job_speed,
)
from benchmarks.rows import Row, render_table
from benchmarks.training_cost import REPO, job_env

EXAMPLES = REPO / "examples" / "models"
BATCH = 128
VERIFICATION_TARGET = 0.03


def _files(workdir: Path, batches: int, epochs: int) -> tuple[Path, Path, Path]:
    """(spec, dataset, definition) files of the benchmark in `workdir`."""
    sys.path.insert(0, str(EXAMPLES))
    try:
        import make_datasets
    finally:
        sys.path.remove(str(EXAMPLES))
    x, y = make_datasets.cifar_like(BATCH * batches)
    data, model = workdir / "images.npz", EXAMPLES / "resnet20.json"
    np.savez(data, x=x, y=y)

    def digest(path: Path) -> str:
        return "sha256:" + hashlib.sha256(path.read_bytes()).hexdigest()

    spec = {
        "name": "resnet20-benchmark",
        "seed": 20,
        "dataset": {
            "generator": "arrays",
            "data": digest(data),
            "params": {"num_classes": 10, "scale": 1 / 255},
            "batch_size": BATCH,
            "train_batches": batches,
        },
        "model": {"architecture": "keras", "definition": digest(model)},
        "training": {
            "epochs": epochs,
            "optimizer": {"name": "sgd", "params": {"learning_rate": 0.05, "momentum": 0.9}},
            "loss": {"name": "sparse_categorical_crossentropy", "params": {"from_logits": True}},
            "metrics": ["accuracy"],
        },
    }
    spec_path = workdir / "spec.json"
    spec_path.write_text(json.dumps(spec))
    return spec_path, data, model


def _run(args: list[str], timeout: float) -> float:
    """Run `python -m ARGS` to its end; its wall time."""
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", *args],
        env=job_env(),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"{args[0]} failed: {done.stderr[-2000:]}")
    return time.monotonic() - started


def _looped(spec: Path, n: int) -> Path:
    """A copy of the spec file with `training.steps_per_execution: n`."""
    data = json.loads(spec.read_text())
    data["training"]["steps_per_execution"] = n
    path = spec.with_name(f"spec-{n}.json")
    path.write_text(json.dumps(data))
    return path


def run_job(spec: Path, data: Path, model: Path, out: Path, timeout: float) -> tuple[Speed, float]:
    """The job's speed (best epoch after the first, with its wall time) and verification's
    share of its training time."""
    files = ("--dataset-file", str(data), "--model-file", str(model))
    checkpoints = ("--checkpoint-dir", str(out.with_suffix(".checkpoints")))
    wall = _run(
        ["worker.run", "--spec", str(spec), "--out", str(out), *files, *checkpoints], timeout
    )
    result: dict[str, Any] = json.loads(out.read_text())
    if result.get("status") != "succeeded":
        raise RuntimeError(f"the job did not succeed: {result.get('error')}")
    t = result["timings"]
    verification = t["fingerprinting"] + t["checkpointing"] + t["data_fingerprints"]
    return replace(job_speed(result).speed, wall_s=wall), verification / t["training"]


def fit_child(
    spec_path: Path, data: Path, model: Path, out: Path, steps_per_execution: int
) -> None:
    """Train the job's model with `model.fit` in this process and write its epoch times."""
    import keras
    import tensorflow as tf

    from worker.data.dataset_format import open_arrays
    from worker.models import registry
    from worker.spec import load_training_spec
    from worker.training.job import Job
    from worker.training.seeds import resolve_seed

    spec = load_training_spec(spec_path)
    seed = resolve_seed(spec.seed)
    tf.config.experimental.enable_op_determinism()
    keras.utils.set_random_seed(seed[0])
    job = Job(spec, seed, data=open_arrays(data), model_definition=model.read_bytes())
    batches = job.data
    dataset = (
        tf.data.Dataset.range(batches.num_batches)
        .map(batches.make_batch, num_parallel_calls=tf.data.AUTOTUNE)
        .prefetch(tf.data.AUTOTUNE)
    )
    metrics = [
        getattr(keras.metrics, registry.METRICS[name])(name=name) for name in spec.training.metrics
    ]
    job.model.compile(
        optimizer=job.optimizer,
        loss=job.loss_fn,
        metrics=metrics,
        steps_per_execution=steps_per_execution,
    )
    seconds: list[float] = []

    class EpochTimer(keras.callbacks.Callback):  # type: ignore[misc]
        def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
            self.start = time.perf_counter()

        def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
            seconds.append(time.perf_counter() - self.start)

    job.model.fit(dataset, epochs=spec.training.epochs, verbose=0, callbacks=[EpochTimer()])
    out.write_text(json.dumps({"seconds": seconds, "steps_per_epoch": batches.num_batches}))


def _fit(spec: Path, data: Path, model: Path, out: Path, n: int, timeout: float) -> Speed:
    """`model.fit` of the job's model in a fresh process, `steps_per_execution=n`."""
    fit_args = ("--spec", str(spec), "--data", str(data), "--model", str(model))
    wall = _run(
        ["benchmarks.keras_definitions", "--fit", *fit_args, "--out", str(out), "--steps", str(n)],
        timeout,
    )
    doc = json.loads(out.read_text())
    speed = _speed([doc["steps_per_epoch"]] * len(doc["seconds"]), doc["seconds"])
    return replace(speed, wall_s=wall)


def measure(quick: bool) -> list[Row]:
    """The job's steps/s and whole process against `model.fit`'s, one step per call and K,
    and verification's share of the job's training."""
    batches, epochs = (3, 2) if quick else (20, 3)
    timeout = 600 if quick else 1800
    n = STEPS_PER_EXECUTION
    with tempfile.TemporaryDirectory(prefix="reprotrain-bench-resnet-") as tmp:
        work = Path(tmp)
        spec, data, model = _files(work, batches, epochs)
        job, share = run_job(spec, data, model, work / "result.json", timeout)
        fit = _fit(spec, data, model, work / "fit.json", 1, timeout)
        fit_n = _fit(spec, data, model, work / "fit-n.json", n, timeout)
        job_n, share_n = run_job(_looped(spec, n), data, model, work / "result-n.json", timeout)
    shape = f"ResNet-20 (resnet20.json), 32x32x3, batch {BATCH} x {batches} steps/epoch"
    rows = [
        _speed_row(f"{shape}, job vs model.fit", job, fit, None),
        _speed_row(
            f"{shape}, job with steps_per_execution: {n} vs model.fit(steps_per_execution={n})",
            job_n,
            fit_n,
            TARGET,
        ),
    ]
    for what, j, f in (
        ("job vs model.fit", job, fit),
        (f"both with {n} steps a call", job_n, fit_n),
    ):
        met = f.wall_s / j.wall_s >= WALL_TARGET
        rows.append(
            Row(
                section="resnet",
                benchmark="model definition: whole process vs a model.fit script",
                configuration=f"{shape}, {epochs} epochs, {what}, start to exit",
                unit="s",
                measured=j.wall_s,
                baseline=f.wall_s,
                ratio=f.wall_s / j.wall_s,
                target=f">= {WALL_TARGET:.2f}",
                met=met,
                cause="" if met else f"the job's process took {j.wall_s - f.wall_s:.1f} s longer",
            )
        )
    worst = max(share, share_n)
    rows.append(
        Row(
            section="resnet",
            benchmark="model definition: verification share of training",
            configuration=f"{shape}: trace points, epoch checkpoints, data fingerprints "
            f"(one step a call {share:.2%}, {n} steps a call {share_n:.2%})",
            unit="share",
            measured=worst,
            baseline=None,
            ratio=worst,
            target=f"<= {VERIFICATION_TARGET:.2f}",
            met=worst <= VERIFICATION_TARGET,
            cause="" if worst <= VERIFICATION_TARGET else "see the jobs' timings",
        )
    )
    return rows


def _speed_row(configuration: str, job: Speed, fit: Speed, target: float | None) -> Row:
    ratio = job.steps_per_s / fit.steps_per_s
    met = None if target is None else ratio >= target
    return Row(
        section="resnet",
        benchmark="model definition: job steps/s vs plain Keras",
        configuration=configuration + ", op determinism on",
        unit="steps/s",
        measured=job.steps_per_s,
        baseline=fit.steps_per_s,
        ratio=ratio,
        target="" if target is None else f">= {target:.2f}",
        met=met,
        cause="" if met is not False else "see the job's timings and train_calls",
        params={"median_job": job.median_steps_per_s, "median_baseline": fit.median_steps_per_s},
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark (or, with --fit, its model.fit child) and print its row."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.keras_definitions")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--fit", action="store_true", help=argparse.SUPPRESS)
    for name in ("spec", "data", "model", "out"):
        parser.add_argument(f"--{name}", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--steps", type=int, default=1, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.fit:
        fit_child(args.spec, args.data, args.model, args.out, args.steps)
        return 0
    print(render_table(measure(args.quick)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
