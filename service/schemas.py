"""Request and response bodies of the API."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any, Generic, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, PlainSerializer, StringConstraints

T = TypeVar("T")

# Ids and counters live in 32-bit INTEGER columns (PostgreSQL); larger numbers are refused.
MAX_ID = 2**31 - 1
Id = Annotated[int, Field(ge=1, le=MAX_ID)]
MAX_AUDIT_COPIES = 16
MAX_DEVICES = 1024  # GPUs or logical CPU devices one worker may advertise
# PostgreSQL text cannot hold NUL characters; names and labels refuse them.
PlainText = Annotated[str, Field(pattern=r"^[^\x00]*$")]


def _utc_iso(value: datetime) -> str:
    # Stored naive-UTC; say so on the wire. (A page of runs formats 200 of these: the naive
    # ones, all that the database gives, skip the time-zone round trip.)
    if value.tzinfo is None:
        return value.isoformat() + "Z"
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
    archived_at: UtcDatetime | None = None  # archived with its ended runs


class RunOut(BaseModel):
    """A run as the API shows it."""

    model_config = ConfigDict(from_attributes=True)

    id: int
    experiment_id: int
    rerun_of_id: int | None
    family_id: int | None
    status: str
    attempt: int
    # Claims take higher priorities first (0 unless an admin set one).
    priority: int = 0
    worker_id: int | None
    required_image: str | None
    # The hardware class (or leading part, e.g. "gpu") a worker must be of to claim it, and
    # for a rerun sent elsewhere on request what it was asked to run on ("any" or a class).
    required_hardware: str | None = None
    hardware_override: str | None = None
    created_at: UtcDatetime
    started_at: UtcDatetime | None
    finished_at: UtcDatetime | None
    lease_expires_at: UtcDatetime | None
    progress: dict[str, Any] | None
    final_fingerprint: str | None
    error: dict[str, Any] | None
    verdict: str | None = None
    is_reference: bool = False
    # or "refine": a re-trace made by POST /compare/refine; "spot-check": a segment's replay
    kind: str = "train"
    audit_id: int | None = None  # the reproducibility audit this run is a copy in
    replicas: int = 1  # devices the run trains on (the spec's distribution.replicas)
    # The global step of the checkpoint the finishing attempt resumed from, if it resumed.
    resumed_from_step: int | None = None
    # The newest spot check's outcome: pending, verified, failed or error (None: never).
    spot_check: str | None = None
    # "worker", or "by_hand": a script run by hand that recorded itself here.
    origin: str = "worker"
    # What people call the run and its tags (PATCH /runs/{id}); None: never given.
    name: str | None = None
    tags: list[str] | None = None
    # When the run was archived (POST /runs/{id}/archive); lists leave it out unless asked.
    archived_at: UtcDatetime | None
    # When retention removed its files, archived past REPRO_ARCHIVE_RETENTION_DAYS.
    files_collected_at: UtcDatetime | None = None


TAG_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.:/+-]{0,63}$"
Tag = Annotated[str, StringConstraints(pattern=TAG_PATTERN)]
MAX_TAGS = 32
MAX_NOTES_CHARS = 10_000


class RunEdit(BaseModel):
    """What `PATCH /runs/{id}` changes: only the fields given. `name` and `notes` replace
    (null or "" clears); `tags` replaces the whole set, `add_tags` and `remove_tags` change
    it. A tag is 1 to 64 characters: letters, digits and `_ . : / + -`, not starting
    with punctuation."""

    model_config = ConfigDict(extra="forbid")

    name: Annotated[str, StringConstraints(max_length=200)] | None = None
    notes: Annotated[str, StringConstraints(max_length=MAX_NOTES_CHARS)] | None = None
    tags: Annotated[list[Tag], Field(max_length=MAX_TAGS)] | None = None
    add_tags: Annotated[list[Tag], Field(max_length=MAX_TAGS)] = []
    remove_tags: Annotated[list[Tag], Field(max_length=MAX_TAGS)] = []


class RunDetail(RunOut):
    """A run with everything recorded about it."""

    notes: str | None = None

    spec: dict[str, Any]
    spec_hash: str
    seed: list[int]
    provenance: dict[str, Any] | None
    metrics: list[Any] | None
    step_metrics: list[Any] | None = Field(
        default=None, description="per-step rows (step, epoch, loss...), at most 1,000 a run"
    )
    data_fingerprints: list[Any] | None
    trace_granularity: str | None
    trace: list[dict[str, Any]]
    result_summary: dict[str, Any] | None
    verdict_report: ComparisonReport | None = None
    reference_run_id: int | None = None
    checkpoint_epoch: int | None = None
    # The global step of the newest checkpoint a requeued run would resume from (epoch-end
    # or mid-epoch step checkpoint).
    checkpoint_step: int | None = None
    # Why a queued run is not being claimed (its pinned image has no live worker), if known.
    waiting_reason: str | None = None
    # Who reported the result (worker, token), the image it reported, and what the server
    # checked: its own recomputation of the final fingerprint, the image allow-list.
    reported_by: dict[str, Any] | None = None


class Page(BaseModel, Generic[T]):
    items: list[T]
    total: int
    limit: int
    offset: int


class RunPage(BaseModel):
    """A page of runs, newest first. `next_cursor` (None on the last page) asks for the
    next one; `total` is counted only when asked with `count=true`."""

    items: list[RunOut]
    next_cursor: str | None
    total: int | None
    limit: int
    offset: int


class SubmitOut(BaseModel):
    experiment: ExperimentOut
    run: RunOut
    audit_id: int | None = None  # with ?copies=N: the reproducibility audit of the N runs
    # What the valid spec does that its author may not expect (rows held out, never read).
    warnings: list[str] = Field(default_factory=list)


class StrictInput(BaseModel):
    """A request body: unknown fields and wrong JSON types are refused, never coerced."""

    model_config = ConfigDict(extra="forbid", strict=True)


class ArtifactOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: int
    run_id: int
    kind: str
    name: str
    epoch: int | None
    sha256: str
    size: int


class TokenIn(StrictInput):
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


class Moment(BaseModel):
    """A point in training: `init`, the end of an epoch, or after a step."""

    kind: Literal["init", "step", "epoch"]
    epoch: int
    step: int
    label: str


class ProvenanceField(BaseModel):
    """One recorded environment field that differs between two runs."""

    field: str
    a: Any
    b: Any
    breaks_reproducibility: bool
    why: str | None


class VariableDifference(BaseModel):
    """How much one variable differs, measured from the two runs' checkpoints."""

    variable: str
    layer: str
    dtype: str | None = None
    shape: list[int] | None = None
    elements: int | None = None
    elements_differing: int | None = None
    max_abs_diff: float | None = None
    relative_norm: float | None = None
    max_ulp: int | None = None
    note: str | None = None


class DataCheck(BaseModel):
    """The data fingerprints of the divergent epoch: equal means the computation diverged."""

    epoch: int
    a: str | None
    b: str | None
    equal: bool | None


class SpecField(BaseModel):
    """One spec field whose value differs between two compared runs (None: absent)."""

    path: str
    a: Any
    b: Any


class MeasuredAt(BaseModel):
    epoch: int
    label: str
    at_divergence: bool


class CodeFileDifference(BaseModel):
    """A file of two runs' code bundles whose digest differs (None: not in that bundle)."""

    path: str
    change: Literal["changed", "added", "removed"]
    a: str | None = None
    b: str | None = None


class ModelLayerDifference(BaseModel):
    """A layer of two runs' model definitions whose config differs (None: not in that one)."""

    layer: str  # its path: model / nested models / layer name
    change: Literal["changed", "added", "removed"]
    class_a: str | None = None
    class_b: str | None = None


class ComparisonReport(BaseModel):
    """Two runs compared: identical, diverged (where, in what, how much, why), or incomparable."""

    verdict: Literal["identical", "diverged", "incomparable"]
    explanation: str
    a: int | None = None
    b: int | None = None
    reason: str | None = None
    fingerprint: str | None = None
    points: int | None = None
    points_inspected: int | None = None
    first_divergence: Moment | None = None
    last_identical: Moment | None = None
    variables: list[str] = Field(default_factory=list)
    variables_only_in: dict[str, list[str]] | None = None
    layers: dict[str, list[str]] = Field(default_factory=dict)
    differences: list[VariableDifference] = Field(default_factory=list)
    differences_measured_at: MeasuredAt | None = None
    differences_note: str | None = None
    cause: Literal["seed", "data", "compute", "unknown"] | None = None
    data: DataCheck | None = None
    data_epochs_differing: list[int] = Field(default_factory=list)
    data_epochs_equal: list[int] = Field(default_factory=list)
    # Runs of different specs are compared at the trace points both recorded; these fields
    # differ (e.g. `distribution.replicas`). Empty for runs of one spec.
    spec_diff: list[SpecField] = Field(default_factory=list)
    provenance_diff: list[ProvenanceField] = Field(default_factory=list)
    warnings: list[str] = Field(default_factory=list)
    # Runs of other code bundles: both digests (None: that run ran none) and the files whose
    # digests differ; a difference changes results. None and [] when the bundles are equal.
    code_bundles: dict[str, str | None] | None = None
    code_files_differing: list[CodeFileDifference] = Field(default_factory=list)
    # Runs of other Keras model definitions: the layers whose config differs (a difference
    # changes results, and the explanation says so). Empty when the definitions are equal.
    model_layers_differing: list[ModelLayerDifference] = Field(default_factory=list)


class PairVerdict(BaseModel):
    """Run b against run a within an N-way comparison; the two-run report has the detail."""

    a: int
    b: int
    verdict: Literal["identical", "diverged", "incomparable"]
    reason: str
    stored: bool  # from a kept report (a rerun's verdict), not worked out for this answer


class DifferingField(BaseModel):
    """A spec or environment field whose value is not the same in every compared run."""

    field: str
    values: list[Any]  # one per run, in the order of `runs` (None: not recorded)
    breaks_reproducibility: bool = False
    why: str | None = None


class MetricCurve(BaseModel):
    run: int
    points: list[tuple[float, float]]  # (epoch, value)


class ManyRunsComparison(BaseModel):
    """N runs compared: every pair's verdict, the fields that differ, the metric curves."""

    runs: list[int]
    pairs: list[PairVerdict]
    spec_diff: list[DifferingField]
    environment_diff: list[DifferingField]
    curves: dict[str, list[MetricCurve]]


class RefineIn(StrictInput):
    a: Id
    b: Id


class RefineRun(BaseModel):
    id: int
    status: str
    required_worker: str | None
    progress: dict[str, Any] | None
    error: dict[str, Any] | None


class RefinementOut(BaseModel):
    """A per-step re-trace of two runs' divergent epoch; `report` once both re-traces finish."""

    id: int
    a: int
    b: int
    epoch: int
    from_epoch: int
    status: Literal["queued", "running", "finished", "failed"]
    runs: list[RefineRun]
    waiting: list[str]
    report: ComparisonReport | None
    created_at: UtcDatetime


class AuditCopy(BaseModel):
    id: int
    status: str
    worker_id: int | None
    worker: str | None
    final_fingerprint: str | None
    verdict: str | None


class ReproAuditOut(BaseModel):
    """N copies of one experiment run at once on different workers: do they all agree?"""

    id: int
    experiment_id: int
    copies: list[AuditCopy]
    finished: bool
    agree: bool | None
    distinct_workers: int
    summary: str
    # Set when every copy ran on one worker: agreement there says nothing across machines.
    caveat: str | None = None
    created_at: datetime | None = None


class DatasetArray(BaseModel):
    """One named array of a dataset: its shape (first dimension: samples) and dtype."""

    name: str
    shape: list[int]
    dtype: str


class StoredState(BaseModel):
    """Whether a stored file is archived (new experiments may not name it) and when its
    bytes were removed by retention (push the same file again to restore them)."""

    archived_at: UtcDatetime | None = None
    files_collected_at: UtcDatetime | None = None


class DatasetOut(StoredState):
    """A pushed dataset: its digest (what a spec's `dataset.data` names), what it holds,
    and who pushed it."""

    model_config = ConfigDict(from_attributes=True)

    digest: str
    name: str
    size: int
    format: str
    samples: int
    arrays: list[DatasetArray]
    pushed_by: str
    created_at: UtcDatetime


class DatasetDetail(DatasetOut):
    """A dataset with the runs that trained on it (newest first, at most 100) and their count."""

    runs: list[int] = Field(default_factory=list)
    runs_total: int = 0
    content_url: str


class ModelLayer(BaseModel):
    """One layer of a model definition, as the server's checker found it."""

    path: str  # model / nested models / layer name
    class_name: str
    parameters: int
    config_sha256: str


class ModelDefinitionOut(StoredState):
    """A pushed Keras model definition: its digest (what a spec's `model.definition` names),
    its size in parameters and layers, and who pushed it."""

    model_config = ConfigDict(from_attributes=True)

    digest: str
    name: str
    size: int
    format: str
    layer_count: int
    parameter_count: int
    pushed_by: str
    created_at: UtcDatetime


class ModelDefinitionDetail(ModelDefinitionOut):
    """A definition with its layers and the runs that trained it (newest first, at most 100)."""

    layers: list[ModelLayer]
    runs: list[int] = Field(default_factory=list)
    runs_total: int = 0
    content_url: str
    # What of the pushed file the server does not use (a .keras archive's weights).
    note: str | None = None


class RunArtifact(ArtifactOut):
    """An artifact of a run, with where to download it."""

    download_url: str
    created_at: UtcDatetime


class KeptRun(BaseModel):
    run: int
    why: str


class StoredFileOut(BaseModel):
    """A stored file (dataset, model definition, code bundle) retention removed or kept."""

    kind: str  # "dataset", "model definition", "code bundle"
    digest: str
    bytes: int = 0
    why: str | None = None  # kept: why its bytes stay


class CollectionOut(BaseModel):
    """What `POST /admin/collect` removed (with `dry_run`, would remove): the files of runs
    archived before `cutoff`, and the archived runs whose files stay, with why; the same
    for archived datasets, model definitions and code bundles (`stored`, `stored_kept`)."""

    dry_run: bool
    retention_days: float
    cutoff: UtcDatetime
    runs: list[int]
    files: int
    bytes: int
    kept: list[KeptRun]
    more: bool = Field(description="more runs are due than one call looks at: call again")
    stored: list[StoredFileOut] = Field(
        default_factory=list, description="datasets, definitions and bundles whose bytes went"
    )
    stored_kept: list[StoredFileOut] = Field(
        default_factory=list, description="archived ones whose bytes stay, with why"
    )


class RunLogOut(BaseModel):
    """A run's job log (its stderr, and a script's stdout) as its worker sent it: the text of
    one attempt from `start` to `end`. Follow a running job by asking again with
    `after=end`; `dropped` counts bytes past the kept bound no longer held."""

    run_id: int
    attempt: int | None = Field(description="the attempt shown; null when no log was sent")
    attempts: list[int] = Field(description="the attempts that sent a log")
    start: int
    end: int
    dropped: int
    text: str
    running: bool = Field(description="whether more may come (the run has not ended)")


class SpotCheckIn(BaseModel):
    """A spot check to queue: how many segments, and optionally the seed that picks them."""

    model_config = ConfigDict(extra="forbid")

    segments: int = Field(
        default=3, ge=1, description="segments to replay (at most REPRO_MAX_SPOT_CHECK_SEGMENTS)"
    )
    seed: int | None = Field(
        default=None,
        ge=0,
        lt=2**63,
        description="picks the segments; absent: the server draws one (and records it)",
    )
    allow_trainer: bool = Field(
        default=False,
        description="let the worker identity (worker token) that trained the run replay it: "
        "that shows the training is deterministic, not that its worker is honest, and the "
        "outcome is then `self-consistent`, never `verified`",
    )


class SpotCheckOut(BaseModel):
    """A spot check: the segments chosen, their replays and, once all ended, the outcome."""

    id: int
    run_id: int
    # pending; verified (every segment replayed bit for bit by another identity than the
    # trainer's); self-consistent (bit for bit, some on the trainer's identity: no proof);
    # failed (a segment did not replay bit for bit); no-other-worker; error.
    status: str
    seed: str  # as text: JavaScript numbers lose digits past 2**53
    requested: int
    segments: list[dict[str, Any]]
    report: dict[str, Any] | None
    requested_by: str | None
    created_at: UtcDatetime
    finished_at: UtcDatetime | None
    # While pending: why replays are not taken (no live worker of another identity).
    waiting_reason: str | None = None
