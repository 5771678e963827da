"""Request and response bodies of the API."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any, Generic, Literal, TypeVar

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, PlainSerializer

from worker.result import JobResult

T = TypeVar("T")

# Ids and counters live in 32-bit INTEGER columns (PostgreSQL); larger numbers are refused.
MAX_ID = 2**31 - 1
Id = Annotated[int, Field(ge=1, le=MAX_ID)]
# PostgreSQL text cannot hold NUL characters; names and labels refuse them.
PlainText = Annotated[str, Field(pattern=r"^[^\x00]*$")]


def _utc_iso(value: datetime) -> str:
    # Stored naive-UTC; say so on the wire.
    return value.replace(tzinfo=UTC).isoformat().replace("+00:00", "Z")


UtcDatetime = Annotated[datetime, PlainSerializer(_utc_iso, return_type=str)]


class ErrorItem(BaseModel):
    """One problem with a request: where (a dotted path such as `body.name`) and what."""

    loc: str
    msg: str
    type: str | None = None


class ErrorOut(BaseModel):
    """The body of every error answer: what went wrong and, for bad input, each problem."""

    detail: str
    errors: list[ErrorItem] = Field(default_factory=list)


class ExperimentOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: int
    name: str
    spec_hash: str
    seed: list[int]
    seed_source: str
    image: str | None
    spec: dict[str, Any]
    created_at: UtcDatetime


class RunOut(BaseModel):
    """A run as the API shows it."""

    model_config = ConfigDict(from_attributes=True)

    id: int
    experiment_id: int
    rerun_of_id: int | None
    family_id: int | None
    status: str
    attempt: int
    worker_id: int | None
    required_image: str | None
    created_at: UtcDatetime
    started_at: UtcDatetime | None
    finished_at: UtcDatetime | None
    lease_expires_at: UtcDatetime | None
    progress: dict[str, Any] | None
    final_fingerprint: str | None
    error: dict[str, Any] | None
    verdict: str | None = None
    is_reference: bool = False


class RunDetail(RunOut):
    """A run with everything recorded about it."""

    spec: dict[str, Any]
    spec_hash: str
    seed: list[int]
    provenance: dict[str, Any] | None
    metrics: list[Any] | None
    data_fingerprints: list[Any] | None
    trace_granularity: str | None
    trace: list[dict[str, Any]]
    result_summary: dict[str, Any] | None
    verdict_report: dict[str, Any] | None = None
    reference_run_id: int | None = None
    checkpoint_epoch: int | None = None


class Page(BaseModel, Generic[T]):
    items: list[T]
    total: int
    limit: int
    offset: int


class SubmitOut(BaseModel):
    experiment: ExperimentOut
    run: RunOut


class _Input(BaseModel):
    """A request body: unknown fields and wrong JSON types are refused, never coerced."""

    model_config = ConfigDict(extra="forbid", strict=True)


class RegisterIn(_Input):
    name: PlainText = Field(min_length=1, max_length=200)
    hostname: PlainText = Field(default="", max_length=200)
    executors: list[str] = Field(default_factory=lambda: ["process"], max_length=8)
    images: list[str] = Field(default_factory=list, max_length=1000)
    gpu: PlainText | None = Field(default=None, max_length=200)


class RegisterOut(BaseModel):
    id: int
    lease_seconds: float
    heartbeat_seconds: float


class WorkerReport(_Input):
    worker_id: Id


class HeartbeatIn(WorkerReport):
    progress: dict[str, Any] | None = None


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
        *((f"provenance.image.{key}", image.get(key), 500) for key in ("digest", "reference")),
    ]
    if any(not isinstance(text, str | None) for _, text, _ in texts):
        raise ValueError("provenance.image.digest and .reference must be strings")
    counts = [
        (f"trace.{i}.{name}", value)
        for i, p in enumerate(result.trace)
        for name, value in (("epoch", p.epoch), ("step", p.step))
    ]
    problems = [
        *(f"{loc} is longer than {n} characters" for loc, text, n in texts if len(text or "") > n),
        *(f"{loc} contains a NUL character" for loc, text, _ in texts if "\x00" in (text or "")),
        *(f"{loc} is not in [0, {MAX_ID}]" for loc, value in counts if not 0 <= value <= MAX_ID),
    ]
    if problems:
        raise ValueError("; ".join(problems))
    return result


class CompleteIn(WorkerReport):
    result: Annotated[JobResult, AfterValidator(_storable)]


class ErrorDoc(_Input):
    model_config = ConfigDict(extra="allow")

    type: str = Field(max_length=200)
    message: str = Field(max_length=100_000)
    traceback: str | None = Field(default=None, max_length=1_000_000)


class FailIn(WorkerReport):
    error: ErrorDoc


class ReleaseIn(WorkerReport):
    reason: str = Field(default="", max_length=1000)


class CheckpointFile(BaseModel):
    name: str
    artifact_id: int
    sha256: str
    size: int


class CheckpointOut(BaseModel):
    epoch: int
    files: list[CheckpointFile]


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


class ArtifactOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: int
    run_id: int
    kind: str
    name: str
    epoch: int | None
    sha256: str
    size: int


class TokenIn(_Input):
    name: PlainText = Field(min_length=1, max_length=200)
    role: Literal["admin", "submitter", "worker", "viewer"]
    expires_in_days: float | None = Field(default=None, gt=0, le=3650)


class TokenOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: int
    name: str
    role: str
    created_at: UtcDatetime
    expires_at: UtcDatetime | None
    revoked_at: UtcDatetime | None
    last_used_at: UtcDatetime | None


class TokenCreated(TokenOut):
    token: str


class AuditOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: int
    at: UtcDatetime
    actor: str
    role: str
    action: str
    target_type: str
    target_id: int | None
    details: dict[str, Any]
