"""What the agent asks of an executor: start one job, hand back its stderr and exit code."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from worker.record.environment_capture import EXPORT_MODEL_ENV


@dataclass(frozen=True)
class JobRequest:
    """One claimed run's job, as the agent laid it out in its per-run workspace."""

    run_id: int | str
    attempt_dir: Path  # per-run workspace (spec.json inside; result.json and job.log written there)
    spec_path: Path
    result_path: Path
    checkpoint_dir: Path
    resume: bool
    max_model_parameters: int | None
    trace_every_steps: int | None
    until_epoch: int | None
    image: str | None  # the image the run pins (None: any)
    # Added to the job's environment: the provenance key and numerics list from the claim.
    environment: Mapping[str, str] = field(default_factory=dict)
    # Stop after this global step, mid-epoch (a spot check's replay); None: no such stop.
    until_step: int | None = None
    # The run's dataset, verified in the node's cache (read-only; the job checks it again).
    dataset_file: Path | None = None
    # Where the job writes the final model (`.keras`) when it succeeds.
    export_model: Path | None = None
    # The run's code bundle (a wheel inside the workspace, verified by digest), if it has one.
    code_file: Path | None = None
    # The run's Keras model definition (inside the workspace, verified by digest), if any.
    model_file: Path | None = None
    # The server's bound on a model definition's largest tensor for one batch.
    max_activation_elements: int | None = None


def export_environment(request: JobRequest, workspace: Path | None = None) -> dict[str, str]:
    """The variable that asks the job to save its final model (a job whose image predates
    model export ignores it); `workspace`: where the attempt directory is in the job's view."""
    if request.export_model is None:
        return {}
    path = request.export_model
    if workspace is not None:
        path = workspace / path.relative_to(request.attempt_dir)
    return {EXPORT_MODEL_ENV: str(path)}


class JobHandle(Protocol):
    """A started job."""

    failure_reason: str | None  # e.g. "out of memory (limit 2g)" when the executor knows why

    def stderr_lines(self) -> Iterator[str]:
        """The job's stderr lines (without newline), progress lines included, until it ends."""
        ...

    def wait(self) -> int:
        """The exit code, like Popen.returncode (negative: the signal that ended it)."""
        ...

    def send_signal(self, sig: int) -> None:
        """SIGTERM: checkpoint after the steps running (or at the epoch end), exit; SIGKILL: now."""
        ...

    def close(self) -> None:
        """Release what the job holds (always called, also after a failure)."""
        ...


class Executor(Protocol):
    """Runs jobs: `process` (a fresh subprocess) or `docker` (a fresh container)."""

    kind: str

    def advertised_images(self) -> list[str]:
        """The images this worker tells the API it can run."""
        ...

    def image_provenance(self) -> dict[str, Any] | None:
        """{"id", "repo_digests", "reference"} of the image jobs run in, or None if unknown."""
        ...

    def start(self, request: JobRequest) -> JobHandle:
        """Start the job; it runs until it ends or is signalled."""
        ...

    def reap_orphans(self) -> None:
        """Remove what a killed agent left behind (called once when the agent starts)."""
        ...
