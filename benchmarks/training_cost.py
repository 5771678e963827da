"""Sections 2 and 3b: what op determinism and the fingerprint trace cost in training.

Each built-in architecture trains a small spec through `python -m worker.run` in a fresh
process (op determinism is process-wide and cannot be switched off again), with
`determinism.op_determinism` on and off, two jobs each (on, off, off, on).

When the keras section ran first in the same command (a full run), this section starts no
process: it reads that section's job (trace share) and its `model.fit` runs of the same
model with op determinism on and off (the determinism ratio, labelled "model.fit"); see
SHARED_JOBS.

- 2, determinism overhead: steps per second with op determinism on, against off. A run's
  rate is its best epoch after the first (which traces and compiles the step), so
  neighbours on a shared machine cost as little as possible.
- 3b, trace share: the job's own `timings`: time spent fingerprinting the state at each
  epoch end, as a share of its training time (which includes it), in the runs with op
  determinism on (as every job runs).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.rounds import progress
from benchmarks.rows import Row

REPO = Path(__file__).resolve().parents[1]
TRACE_TARGET = 0.02
# What the keras section (which runs first in a full run) already measured on these specs,
# so this section need not start the same processes again (each costs seconds of
# interpreter and TensorFlow start-up, twice for a job): the result of its job per model
# (op determinism on, as every job runs), and the steps/s (best, median) of `model.fit`
# of the same model with op determinism on and off, by (model, op determinism).
SHARED_JOBS: dict[str, dict[str, Any]] = {}
SHARED_FIT: dict[tuple[str, bool], tuple[float, float]] = {}
_OPTIMIZER = {"name": "adam", "params": {"learning_rate": 0.001}}
_LOSS = {"name": "sparse_categorical_crossentropy", "params": {"from_logits": True}}


def _spec(
    name: str,
    generator: str,
    generator_params: dict[str, Any],
    architecture: str,
    model_params: dict[str, Any],
    *,
    batch_size: int,
    batches: int,
    epochs: int,
) -> dict[str, Any]:
    return {
        "name": f"bench-{name}",
        "seed": 20240611,
        "dataset": {
            "generator": generator,
            "params": generator_params,
            "batch_size": batch_size,
            "train_batches": batches,
        },
        "model": {"architecture": architecture, "params": model_params},
        "training": {"epochs": epochs, "optimizer": _OPTIMIZER, "loss": _LOSS},
    }


def specs(quick: bool) -> dict[str, dict[str, Any]]:
    """One small spec per built-in architecture, with epochs of about half a second: short
    enough that on a shared machine some run undisturbed, long enough to time.

    `quick` trains the MLP only, for a few steps: a smoke run.
    """
    epochs, scale = (2, 0.2) if quick else (4, 1.0)

    def n(batches: int) -> int:
        return max(2, round(batches * scale))

    tokens = {"vocab_size": 64, "seq_len": 32, "num_classes": 4}
    every = {
        "mlp": _spec(
            "mlp",
            "gaussian_blobs",
            {"num_features": 64, "num_classes": 10},
            "mlp",
            {"hidden": [256, 256]},
            batch_size=256,
            batches=n(100),
            epochs=epochs,
        ),
        "small_cnn": _spec(
            "small_cnn",
            "pattern_images",
            {"image_size": 16, "channels": 1, "num_classes": 4},
            "small_cnn",
            {"filters": [16, 32], "dense": 64},
            batch_size=64,
            batches=n(30),
            epochs=epochs,
        ),
        "tiny_transformer": _spec(
            "tiny_transformer",
            "token_sequences",
            tokens,
            "tiny_transformer",
            {"embed_dim": 32, "num_heads": 2, "ff_dim": 64},
            batch_size=64,
            batches=n(25),
            epochs=epochs,
        ),
        "gru": _spec(
            "gru",
            "token_sequences",
            tokens,
            "gru",
            {"embed_dim": 32, "units": 64},
            batch_size=64,
            batches=n(20),
            epochs=epochs,
        ),
    }
    return {"mlp": every["mlp"]} if quick else every


def job_env() -> dict[str, str]:
    """This environment without determinism settings, so each job sets its own."""
    drop = ("PYTHONHASHSEED", "REPRO_JOB_REEXEC", "TF_DETERMINISTIC_OPS")
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    return env


def run_job(spec: dict[str, Any], workdir: Path, timeout: float = 300) -> dict[str, Any]:
    """Run `python -m worker.run` on a spec to completion; its result document."""
    workdir.mkdir(parents=True, exist_ok=True)
    spec_path, out = workdir / "spec.json", workdir / "result.json"
    spec_path.write_text(json.dumps(spec))
    done = subprocess.run(
        [sys.executable, "-m", "worker.run", "--spec", str(spec_path), "--out", str(out)],
        env=job_env(),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    result: dict[str, Any] = json.loads(out.read_text()) if out.exists() else {}
    if done.returncode != 0 or result.get("status") != "succeeded":
        error = (result.get("error") or {}).get("message") or done.stderr[-2000:]
        raise RuntimeError(f"{spec['name']}: the job did not succeed: {error}")
    return result


@dataclass
class Trained:
    steps_per_s: float  # best epoch after the first
    median_steps_per_s: float
    training_s: float
    fingerprinting_s: float
    epochs: int


def trained(result: dict[str, Any]) -> Trained:
    rates = []
    previous_step = 0
    for row in result["metrics"]:
        steps = row["step"] - previous_step
        previous_step = row["step"]
        if row["epoch"] > 1:
            rates.append(steps / row["seconds"])
    if not rates:
        raise RuntimeError("a spec needs at least two epochs to time one after compilation")
    rates.sort()
    timings = result["timings"]
    return Trained(
        steps_per_s=rates[-1],
        median_steps_per_s=rates[len(rates) // 2],
        training_s=timings["training"],
        fingerprinting_s=timings["fingerprinting"],
        epochs=len(result["metrics"]),
    )


def best_of(runs: list[Trained]) -> Trained:
    """The best rate of several jobs of one setting, and their summed trace and training time."""
    best = max(runs, key=lambda t: t.steps_per_s)
    return Trained(
        steps_per_s=best.steps_per_s,
        median_steps_per_s=best.median_steps_per_s,
        training_s=sum(t.training_s for t in runs),
        fingerprinting_s=sum(t.fingerprinting_s for t in runs),
        epochs=sum(t.epochs for t in runs),
    )


def with_determinism(spec: dict[str, Any], on: bool) -> dict[str, Any]:
    """The spec with op determinism set explicitly."""
    return {**spec, "determinism": {"op_determinism": on}}


def _shared(model: str) -> tuple[Trained, tuple[float, float], tuple[float, float]] | None:
    """The keras section's job, and its model.fit rates on and off, if it measured them."""
    job = SHARED_JOBS.get(model)
    on, off = SHARED_FIT.get((model, True)), SHARED_FIT.get((model, False))
    if job is None or on is None or off is None:
        return None
    return trained(job), on, off


def measure(quick: bool) -> list[Row]:
    cases = specs(quick)
    jobs: dict[tuple[str, bool], list[Trained]] = {}
    # (on, off, median on, median off, what ran) per model
    rates: dict[str, tuple[float, float, float, float, str]] = {}
    with tempfile.TemporaryDirectory(prefix="reprotrain-bench-train-") as tmp:
        for i, (model, spec) in enumerate(cases.items()):
            shared = _shared(model)
            if shared is not None:
                job, on_fit, off_fit = shared
                jobs[model, True] = [job]
                rates[model] = (on_fit[0], off_fit[0], on_fit[1], off_fit[1], "model.fit")
                continue
            # ABBA, and BAAB for the next model: neither setting always meets a warmer machine.
            # Two processes per setting, since a job's speed also varies from process to process.
            order = (True, False) if i % 2 == 0 else (False, True)
            for n, setting in enumerate(order if quick else (*order, *reversed(order))):
                progress(f"training {model}, op determinism {'on' if setting else 'off'}")
                result = run_job(with_determinism(spec, setting), Path(tmp) / f"{model}-{n}")
                jobs.setdefault((model, setting), []).append(trained(result))
    results = {key: best_of(runs) for key, runs in jobs.items()}
    for model in cases:
        if model not in rates:
            on, off = results[model, True], results[model, False]
            rates[model] = (
                on.steps_per_s,
                off.steps_per_s,
                on.median_steps_per_s,
                off.median_steps_per_s,
                "jobs",
            )

    rows = []
    for model, spec in cases.items():
        on_rate, off_rate, median_on, median_off, ran = rates[model]
        ds = spec["dataset"]
        config = f"{model}, batch {ds['batch_size']} x {ds['train_batches']} steps/epoch, {ran}"
        rows.append(
            Row(
                section="determinism",
                benchmark="op determinism on vs off",
                configuration=config,
                unit="steps/s",
                measured=on_rate,
                baseline=off_rate,
                ratio=on_rate / off_rate,
                params={
                    "model": model,
                    "ran": ran,
                    "median_on": median_on,
                    "median_off": median_off,
                },
            )
        )
    for model in cases:
        on = results[model, True]
        share = on.fingerprinting_s / on.training_s
        epochs = on.epochs
        per_point = on.fingerprinting_s / epochs
        rows.append(
            Row(
                section="trace",
                benchmark="per-epoch trace share of training",
                configuration=f"{model}, {len(jobs[model, True])} "
                f"job{'s' if len(jobs[model, True]) > 1 else ''}, epochs of "
                f"{on.training_s / epochs:.2f} s: "
                f"{per_point * 1000:.1f} ms per trace point",
                unit="s",
                measured=on.fingerprinting_s,
                baseline=on.training_s,
                ratio=share,
                target=f"<= {TRACE_TARGET:.2f}",
                met=share <= TRACE_TARGET,
                cause=""
                if share <= TRACE_TARGET
                else f"a trace point costs {per_point * 1000:.1f} ms (reading and hashing the "
                "state; more when the job reseeds TensorFlow every epoch, which clears the "
                f"eager kernels' caches); epochs over {per_point / TRACE_TARGET:.2f} s keep the "
                "share under the target",
                params={"model": model, "share": share, "per_point_s": per_point},
            )
        )
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    """Run the section on its own and print its rows."""
    from benchmarks.rows import render_table

    print(render_table(measure("--quick" in (argv or sys.argv[1:]))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
