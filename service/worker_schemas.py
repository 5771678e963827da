"""Bodies of the worker-facing API: registration, heartbeats, claims and leases, and the
reports that end an attempt (complete, fail, release)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from service.json_bounds import DETAILS, RESULT, BoundedProgress, bounded_extras, bounded_fields
from service.runs.logs import PIECE_CHARS
from service.runs.reported_values import checked_progress, metrics_problems
from service.schemas import MAX_DEVICES, MAX_ID, Id, PlainText, StrictInput, UtcDatetime
from service.storage.artifacts import SAFE_NAME, SHA256_HEX
from worker.record.hardware import MAX_CLASS_CHARS, REQUIREMENT_PATTERN
from worker.result import JobResult

# A capability string: an executor's name, or an image reference (a rerun pins the image
# its run reported in a 500-character column); the count of images is REPRO_MAX_WORKER_IMAGES.
ExecutorName = Annotated[PlainText, Field(min_length=1, max_length=40)]
ImageRef = Annotated[PlainText, Field(min_length=1, max_length=500)]


class ReadinessFlag(StrictInput):
    """One threat to reproducibility the worker's checks found (`repro doctor`'s flags)."""

    check: PlainText = Field(min_length=1, max_length=40)
    message: PlainText = Field(min_length=1, max_length=1000)


class RegisterIn(StrictInput):
    name: PlainText = Field(min_length=1, max_length=200)
    hostname: PlainText = Field(default="", max_length=200)
    executors: list[ExecutorName] = Field(default_factory=lambda: ["process"], max_length=8)
    images: list[ImageRef] = Field(default_factory=list, max_length=1000)
    gpu: PlainText | None = Field(default=None, max_length=200)
    # GPUs the node counted; for a node without GPUs, the logical CPU devices it lets a job
    # create. A run asking for N replicas goes only to a worker with N devices.
    gpus: int | None = Field(default=None, ge=0, le=MAX_DEVICES)
    cpu_devices: int | None = Field(default=None, ge=1, le=MAX_DEVICES)
    # Whether it runs code bundles: the docker executor does, a process worker only when its
    # operator said so (--trust-code). Runs with a bundle go only to such workers.
    accepts_code: bool = False
    # What its reproducibility checks flagged at start; None when it did not run them. The
    # count is bounded by REPRO_MAX_WORKER_FLAGS.
    readiness_flags: list[ReadinessFlag] | None = Field(default=None, max_length=256)
    # Its hardware class (worker.record.hardware): runs requiring one go only to its workers.
    hardware_class: str | None = Field(
        default=None, max_length=MAX_CLASS_CHARS, pattern=REQUIREMENT_PATTERN
    )
    # The pool it belongs to (REPRO_WORKER_POOL): a label of its held runs, for autoscalers.
    pool: PlainText | None = Field(default=None, max_length=200)


class RegisterOut(BaseModel):
    id: int
    lease_seconds: float
    heartbeat_seconds: float
    # New progress goes out at most this often between two heartbeats.
    progress_seconds: float = 5.0
    devices: int = 1  # the replicas this worker can be given: its GPUs, else its CPU devices
    # Whether files go to the object store by presigned URL (POST /runs/{id}/artifact-uploads)
    # rather than through the API; uploads to the API work either way.
    presigned_uploads: bool = False


class EnrollOut(RegisterOut):
    # The worker's own credential (a worker token for this worker alone), shown once: the
    # agent keeps it and uses it instead of the bootstrap token from then on.
    credential: str
    credential_id: int


class WorkerOut(BaseModel):
    """A registered worker and what it can run."""

    model_config = ConfigDict(from_attributes=True)

    id: int
    name: str
    hostname: str
    executors: list[str]
    images: list[str]
    gpu: str | None
    gpus: int
    cpu_devices: int | None
    devices: int
    accepts_code: bool = False
    readiness_flags: list[dict[str, str]] | None = None
    hardware_class: str | None = None
    pool: str | None = None
    registered_at: UtcDatetime
    last_seen_at: UtcDatetime


class WorkerReport(StrictInput):
    worker_id: Id
    # The attempt the report is about (the claim's run.attempt): a report of an attempt that
    # is over is refused (409) even if the same worker holds a later one. Optional for
    # agents that predate it.
    attempt: Id | None = None


class ArtifactUploadIn(WorkerReport):
    """A file the worker will PUT to the object store (the ticket), or has (the completion)."""

    kind: Literal["checkpoint", "model"]
    name: str = Field(pattern=SAFE_NAME)
    epoch: int | None = Field(default=None, ge=0, le=MAX_ID)
    sha256: str = Field(pattern=SHA256_HEX)
    size: int = Field(ge=0, le=2**63 - 1)


class UploadTicketOut(BaseModel):
    """Where to send the bytes: `method` `url` with exactly `headers`, before `expires_at`;
    then POST the same body to /runs/{id}/artifact-uploads/{upload_id}."""

    upload_id: str
    method: Literal["PUT"] = "PUT"
    url: str
    headers: dict[str, str]
    expires_at: UtcDatetime


class LogPiece(StrictInput):
    """New lines of the job's log, and where they start in the attempt's log (bytes)."""

    offset: int = Field(ge=0, le=2**62)
    text: str = Field(max_length=PIECE_CHARS)


class HeartbeatIn(WorkerReport):
    # Counters and numbers checked, so the run's pages can always show them.
    progress: Annotated[BoundedProgress | None, AfterValidator(checked_progress)] = None
    log: LogPiece | None = None  # taken only with `attempt`, which the pieces are of


class HeartbeatOut(BaseModel):
    lease_expires_at: UtcDatetime


def _storable(result: JobResult) -> JobResult:
    # A real job never exceeds these; a report that does gets a 422, not a database error.
    image = result.provenance.get("image") or {}
    if not isinstance(image, dict):
        raise ValueError("provenance.image must be a mapping")
    texts = [
        ("final_fingerprint", result.final_fingerprint, 100),
        ("trace_granularity", result.trace_granularity, 40),
        *((f"trace.{i}.fingerprint", p.fingerprint, 100) for i, p in enumerate(result.trace)),
        # A rerun pins the image its run reported (a 500-character column).
        *(
            (f"provenance.image.{key}", image.get(key), 500)
            for key in ("id", "digest", "reference")
        ),
    ]
    if any(not isinstance(text, str | None) for _, text, _ in texts):
        raise ValueError("provenance.image.id, .digest and .reference must be strings")
    counts = [
        (f"trace.{i}.{name}", value)
        for i, p in enumerate(result.trace)
        for name, value in (("epoch", p.epoch), ("step", p.step))
    ]
    problems = [
        *(f"{loc} is longer than {n} characters" for loc, text, n in texts if len(text or "") > n),
        *(f"{loc} contains a NUL character" for loc, text, _ in texts if "\x00" in (text or "")),
        *(f"{loc} is not in [0, {MAX_ID}]" for loc, value in counts if not 0 <= value <= MAX_ID),
        *metrics_problems(result.metrics),
        *metrics_problems(result.step_metrics, "step_metrics"),
    ]
    if problems:
        raise ValueError("; ".join(problems))
    return result


# A result document as the server stores it: a worker's, or a script's run by hand.
StorableResult = Annotated[
    JobResult,
    AfterValidator(_storable),
    # The free-form parts of a result, stored and shown on the run's pages.
    bounded_fields("spec", "provenance", "determinism", "metrics", "step_metrics", bounds=RESULT),
]


class CompleteIn(WorkerReport):
    result: StorableResult


class ErrorDoc(StrictInput):
    model_config = ConfigDict(extra="allow")

    type: str = Field(max_length=200)
    message: str = Field(max_length=100_000)
    traceback: str | None = Field(default=None, max_length=1_000_000)


class FailIn(WorkerReport):
    error: Annotated[ErrorDoc, bounded_extras(DETAILS)]


class ReleaseIn(WorkerReport):
    reason: str = Field(default="", max_length=1000)


class CheckpointFile(BaseModel):
    name: str
    artifact_id: int
    sha256: str
    size: int


class CheckpointOut(BaseModel):
    """Where a claimed run resumes: an epoch-end or a mid-epoch step checkpoint."""

    epoch: int  # epochs completed at the checkpoint
    files: list[CheckpointFile]
    step: int | None = None  # its global step (None only from a server that did not know it)
    kind: Literal["epoch", "step"] = "epoch"


class ClaimedRun(BaseModel):
    id: int
    experiment_id: int
    spec: dict[str, Any]
    attempt: int
    image: str | None


class LeaseOut(BaseModel):
    expires_at: UtcDatetime
    seconds: float


class ClaimOut(BaseModel):
    run: ClaimedRun
    lease: LeaseOut
    checkpoint: CheckpointOut | None
    limits: dict[str, int] = Field(default_factory=dict)
    # Job options beyond the spec: `trace_every_steps`, `until_epoch` (a re-trace),
    # `until_step` (a spot check's replay that ends mid-epoch).
    job: dict[str, int] = Field(default_factory=dict)
    # How the job records its environment: `key` (digests of values outside the numerics
    # list) and `numeric_env_vars` (the operator's additions to that list).
    provenance: dict[str, Any] = Field(default_factory=dict)


# host:port, or [IPv6]:port: where a member's job listens for the others' collectives.
GANG_ADDRESS = r"^(?:[A-Za-z0-9.\-]+|\[[0-9A-Fa-f:.]+\]):[0-9]{1,5}$"


class GangJoinIn(StrictInput):
    """A worker's try to be in a gang: where its job will listen for the others."""

    address: str = Field(
        min_length=3,
        max_length=300,
        pattern=r"^[A-Za-z0-9.\-]+:[0-9]{1,5}$|^\[[0-9A-Fa-f:.]+\]:[0-9]{1,5}$",
    )


class GangOut(BaseModel):
    """`none`: no gang for this worker now (claim other work). `forming`: it is in the gang
    of run `run_id`, `joined` of `hosts` so far; ask again. `formed`: the run is its to
    train as `rank`, with the others at `cluster` (by rank) and the run's claim."""

    state: Literal["none", "forming", "formed"]
    run_id: int | None = None
    hosts: int = 0
    joined: int = 0
    rank: int | None = None
    cluster: list[str] = Field(default_factory=list)
    claim: ClaimOut | None = None
