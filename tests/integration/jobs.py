"""Running real jobs in fresh processes, as a worker does."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from worker.node.executors.base import JobRequest
from worker.result import JobResult, read_result
from worker.training.progress import parse_line

REPO = Path(__file__).resolve().parents[2]


@dataclass
class Finished:
    returncode: int
    result: JobResult
    events: list[dict[str, Any]]
    stderr: str


def job_env(extra_paths: list[Path] | None = None) -> dict[str, str]:
    """The test process's environment without determinism settings, so jobs set their own."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONHASHSEED", "REPRO_JOB_REEXEC")}
    paths = [str(p) for p in (extra_paths or [])] + [str(REPO)]
    env["PYTHONPATH"] = os.pathsep.join([*paths, env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    return env


def write_spec(spec: dict[str, Any] | str, directory: Path, name: str = "spec.json") -> Path:
    path = directory / name
    path.write_text(spec if isinstance(spec, str) else json.dumps(spec))
    return path


def job_request(
    attempt_dir: Path, spec: dict[str, Any], run_id: str, image: str | None, **more: Any
) -> JobRequest:
    """A job laid out as an agent lays out a claimed run: the spec in `attempt_dir`."""
    (attempt_dir / "checkpoints").mkdir(parents=True)
    return JobRequest(
        run_id=run_id,
        attempt_dir=attempt_dir,
        spec_path=write_spec(spec, attempt_dir),
        result_path=attempt_dir / "result.json",
        checkpoint_dir=attempt_dir / "checkpoints",
        resume=False,
        max_model_parameters=None,
        trace_every_steps=None,
        until_epoch=None,
        image=image,
        **more,
    )


def run_job(
    spec: dict[str, Any] | str | Path,
    workdir: Path,
    *args: str,
    extra_paths: list[Path] | None = None,
    env: dict[str, str] | None = None,
    timeout: float = 300,
) -> Finished:
    """Run `python -m worker.run` to completion in a fresh process (with `env` added)."""
    workdir.mkdir(parents=True, exist_ok=True)
    spec_path = spec if isinstance(spec, Path) else write_spec(spec, workdir)
    out = workdir / "result.json"
    proc = subprocess.run(
        [sys.executable, "-m", "worker.run", "--spec", str(spec_path), "--out", str(out), *args],
        env={**job_env(extra_paths), **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    events = [e for e in map(parse_line, proc.stderr.splitlines()) if e is not None]
    return Finished(proc.returncode, read_result(out), events, proc.stderr)


def blobs_spec(**changes: Any) -> dict[str, Any]:
    """A small classification experiment with Dropout and BatchNorm."""
    spec: dict[str, Any] = {
        "name": "blobs-mlp",
        "seed": 1234,
        "dataset": {
            "generator": "gaussian_blobs",
            "params": {"num_features": 8, "num_classes": 3},
            "batch_size": 32,
            "train_batches": 6,
            "eval_batches": 2,
        },
        "model": {
            "architecture": "mlp",
            "params": {"hidden": [32, 16], "dropout": 0.3, "batch_norm": True},
        },
        "training": {
            "epochs": 4,
            "optimizer": {"name": "adam", "params": {"learning_rate": 0.01}},
            "loss": {"name": "sparse_categorical_crossentropy", "params": {"from_logits": True}},
            "metrics": ["accuracy"],
        },
    }
    spec.update(changes)
    return spec
