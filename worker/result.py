"""The result document a job writes (TensorFlow-free; the API reads it as it is)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field

from worker.record.trace import TracePoint
from worker.spec import ExperimentSpec, ScriptExperimentSpec
from worker.training.seeds import resolve_seed

S = TypeVar("S", ExperimentSpec, ScriptExperimentSpec)

RESULT_FORMAT = 1
MAX_STEP_POINTS = 1000  # per-step metric rows a result holds, spread evenly over the run


def step_bucket_size(total_steps: int) -> int:
    """Steps per per-step metric row: one row a bucket keeps a run within MAX_STEP_POINTS."""
    return max(1, -(-total_steps // MAX_STEP_POINTS))


class JobError(BaseModel):
    model_config = ConfigDict(extra="forbid")

    type: str
    message: str
    phase: Literal["spec", "training"] = "training"
    traceback: str | None = None
    errors: list[dict[str, str]] = Field(default_factory=list)  # field problems of a bad spec


class DataFingerprint(BaseModel):
    model_config = ConfigDict(extra="forbid")

    epoch: int
    fingerprint: str


class JobResult(BaseModel):
    """Everything one job produced: verdict material, provenance and diagnostics."""

    model_config = ConfigDict(extra="forbid")

    format: Literal[1] = 1
    status: Literal["succeeded", "failed", "interrupted"]
    spec_hash: str | None = None
    seed: list[int] | None = None
    seed_source: Literal["spec", "generated"] | None = None
    spec: dict[str, Any] | None = None
    provenance: dict[str, Any] = Field(default_factory=dict)
    determinism: dict[str, Any] = Field(default_factory=dict)
    metrics: list[dict[str, Any]] = Field(default_factory=list)
    # Per-step values ({"step", "epoch", "loss", ...}), at most MAX_STEP_POINTS of them spread
    # over the run: for curves only, never compared.
    step_metrics: list[dict[str, Any]] = Field(default_factory=list, max_length=MAX_STEP_POINTS)
    trace: list[TracePoint] = Field(default_factory=list)
    trace_granularity: str | None = None
    final_fingerprint: str | None = None
    data_fingerprints: list[DataFingerprint] = Field(default_factory=list)
    eval_data_fingerprint: str | None = None
    checkpoints: list[str] = Field(default_factory=list)
    resumed_from_epoch: int | None = None  # set when resumed from an epoch checkpoint
    resumed_from_step: int | None = None  # global step of the checkpoint resumed from
    interrupted_after_epoch: int | None = None
    interrupted_at_step: int | None = None  # a stop mid-epoch: its step checkpoint's step
    until_epoch: int | None = None  # set when asked to finish early (a re-trace)
    until_step: int | None = None  # set when asked to stop after a global step (a replay)
    warnings: list[str] = Field(default_factory=list)
    timings: dict[str, float] = Field(default_factory=dict)
    error: JobError | None = None


def first_result(spec: S) -> tuple[S, JobResult]:
    """The spec with its seed resolved (a null seed drawn now), and the result document of
    its job as it stands before anything ran: failed, until the job says otherwise."""
    resolved = spec.with_seed(resolve_seed(spec.seed))
    assert resolved.seed is not None
    return resolved, JobResult(
        status="failed",
        spec_hash=resolved.spec_hash(),
        seed=list(resolved.seed),
        seed_source="spec" if spec.seed is not None else "generated",
        spec=resolved.model_dump(mode="json"),
    )


def write_result(result: JobResult, path: Path) -> None:
    """Write the result atomically, so a reader never sees half a document."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w") as fh:
        fh.write(result.model_dump_json(indent=1))
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def read_result(path: Path) -> JobResult:
    """Parse a result document."""
    return JobResult.model_validate(json.loads(Path(path).read_text()))
