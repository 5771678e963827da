"""ResNet-20 as a stored model definition: a job's steps/s against `model.fit` (information).

The definition is examples/models/resnet20.json, the data a CIFAR-shaped array dataset
(examples/models/make_datasets.py), 32x32x3 at batch 128. Each side runs in a fresh
process, as in keras_baseline.py:

- measured: `python -m worker.run --dataset-file D --model-file M` with everything on (op
  determinism, a trace point at every epoch end, data fingerprints); steps per second of
  its best epoch after the first.
- baseline: the same model (the job's own, loaded from the same definition with the same
  seed) compiled with the same optimizer, loss and metrics and trained by `model.fit` on a
  plain tf.data pipeline over the same generator, op determinism on.

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
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.keras_baseline import Speed, _speed, job_speed
from benchmarks.rows import Row, render_table
from benchmarks.training_cost import REPO, job_env

EXAMPLES = REPO / "examples" / "models"
BATCH = 128


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


def _run(args: list[str], timeout: float) -> None:
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


def run_job(spec: Path, data: Path, model: Path, out: Path, timeout: float) -> Speed:
    """The job's speed: best epoch after the first."""
    files = ("--dataset-file", str(data), "--model-file", str(model))
    _run(["worker.run", "--spec", str(spec), "--out", str(out), *files], timeout)
    result: dict[str, Any] = json.loads(out.read_text())
    if result.get("status") != "succeeded":
        raise RuntimeError(f"the job did not succeed: {result.get('error')}")
    return job_speed(result).speed


def fit_child(spec_path: Path, data: Path, model: Path, out: Path) -> None:
    """Train the job's model with `model.fit` in this process and write its epoch times."""
    import keras
    import tensorflow as tf

    from worker.data.dataset_format import open_arrays
    from worker.models import registry
    from worker.spec import load_spec
    from worker.training.job import Job
    from worker.training.seeds import resolve_seed

    spec = load_spec(spec_path)
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
    job.model.compile(optimizer=job.optimizer, loss=job.loss_fn, metrics=metrics)
    seconds: list[float] = []

    class EpochTimer(keras.callbacks.Callback):  # type: ignore[misc]
        def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
            self.start = time.perf_counter()

        def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
            seconds.append(time.perf_counter() - self.start)

    job.model.fit(dataset, epochs=spec.training.epochs, verbose=0, callbacks=[EpochTimer()])
    out.write_text(json.dumps({"seconds": seconds, "steps_per_epoch": batches.num_batches}))


def measure(quick: bool) -> list[Row]:
    """One row: the job's steps/s against `model.fit`'s, for information."""
    batches, epochs = (3, 2) if quick else (8, 3)
    timeout = 600 if quick else 1800
    with tempfile.TemporaryDirectory(prefix="reprotrain-bench-resnet-") as tmp:
        work = Path(tmp)
        spec, data, model = _files(work, batches, epochs)
        job = run_job(spec, data, model, work / "result.json", timeout)
        fit_out = work / "fit.json"
        fit_args = ("--spec", str(spec), "--data", str(data), "--model", str(model))
        _run(["benchmarks.keras_definitions", "--fit", *fit_args, "--out", str(fit_out)], timeout)
        doc = json.loads(fit_out.read_text())
        fit = _speed([doc["steps_per_epoch"]] * len(doc["seconds"]), doc["seconds"])
    return [
        Row(
            section="keras",
            benchmark="model definition: job steps/s vs plain Keras",
            configuration=f"ResNet-20 (resnet20.json), 32x32x3, batch {BATCH} x {batches} "
            "steps/epoch, vs model.fit, op determinism on",
            unit="steps/s",
            measured=job.steps_per_s,
            baseline=fit.steps_per_s,
            ratio=job.steps_per_s / fit.steps_per_s,
            params={
                "median_job": job.median_steps_per_s,
                "median_baseline": fit.median_steps_per_s,
                "epochs": epochs,
            },
        )
    ]


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark (or, with --fit, its model.fit child) and print its row."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.keras_definitions")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--fit", action="store_true", help=argparse.SUPPRESS)
    for name in ("spec", "data", "model", "out"):
        parser.add_argument(f"--{name}", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.fit:
        fit_child(args.spec, args.data, args.model, args.out)
        return 0
    print(render_table(measure(args.quick)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
