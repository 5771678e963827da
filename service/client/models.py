"""The API's answers as typed objects. Each keeps every field the API sent (unknown ones
too) and the answer itself in `raw`, for printing or saving as JSON."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr


class ApiModel(BaseModel):
    """An answer of the API; fields a newer server adds are kept, not refused."""

    model_config = ConfigDict(extra="allow")
    _raw: dict[str, Any] = PrivateAttr(default_factory=dict)

    @classmethod
    def from_api(cls, data: dict[str, Any]) -> Self:
        """The object of an API answer, which stays available as `raw`."""
        made = cls.model_validate(data)
        made._raw = data
        return made

    @property
    def raw(self) -> dict[str, Any]:
        """The answer as the API sent it."""
        return self._raw


class Experiment(ApiModel):
    """A submitted spec with the seed it resolved to."""

    id: int
    name: str
    spec_hash: str
    seed: list[int]
    seed_source: str | None = None
    image: str | None = None
    spec: dict[str, Any] = Field(default_factory=dict)
    created_at: datetime | None = None
    archived_at: datetime | None = None  # archived with its runs (`archive_experiment`)


class ProvenanceField(ApiModel):
    """One environment field that differs between two runs."""

    field: str
    a: Any = None
    b: Any = None
    breaks_reproducibility: bool = False


class SpecField(ApiModel):
    """One spec field that differs between two runs."""

    path: str
    a: Any = None
    b: Any = None


class Comparison(ApiModel):
    """Run b compared with run a: the verdict, why, and where they first diverge."""

    verdict: Literal["identical", "diverged", "incomparable"]
    explanation: str = ""
    a: int | None = None
    b: int | None = None
    reason: str | None = None
    fingerprint: str | None = None
    cause: str | None = None
    first_divergence: dict[str, Any] | None = None
    last_identical: dict[str, Any] | None = None
    variables: list[str] = Field(default_factory=list)
    differences: list[dict[str, Any]] = Field(default_factory=list)
    spec_diff: list[SpecField] = Field(default_factory=list)
    provenance_diff: list[ProvenanceField] = Field(default_factory=list)
    warnings: list[str] = Field(default_factory=list)

    @property
    def identical(self) -> bool:
        """Whether the two runs are bitwise identical."""
        return self.verdict == "identical"


class PairVerdict(ApiModel):
    """Run b against run a within an N-way comparison; `Client.compare` has the detail."""

    a: int
    b: int
    verdict: Literal["identical", "diverged", "incomparable"]
    reason: str = ""
    stored: bool = False  # read from the report kept when a rerun finished


class DifferingField(ApiModel):
    """A spec or environment field whose value is not the same in every compared run."""

    field: str
    values: list[Any] = Field(default_factory=list)  # one per run, in the order of `runs`
    breaks_reproducibility: bool = False
    why: str | None = None


class MetricCurve(ApiModel):
    """One run's values of a metric, as (epoch, value) points."""

    run: int
    points: list[tuple[float, float]] = Field(default_factory=list)


class RunsComparison(ApiModel):
    """N runs compared at once: every pair's verdict, the spec and environment fields that
    differ among them (only those), and each metric's curve per run."""

    runs: list[int]
    pairs: list[PairVerdict] = Field(default_factory=list)
    spec_diff: list[DifferingField] = Field(default_factory=list)
    environment_diff: list[DifferingField] = Field(default_factory=list)
    curves: dict[str, list[MetricCurve]] = Field(default_factory=dict)

    @property
    def identical(self) -> bool:
        """Whether every pair of the runs is bitwise identical."""
        return all(p.verdict == "identical" for p in self.pairs)

    def pair(self, a: int, b: int) -> PairVerdict:
        """The verdict of two of the compared runs, in either order (KeyError otherwise)."""
        for found in self.pairs:
            if {found.a, found.b} == {a, b} and a != b:
                return found
        raise KeyError(f"runs {a} and {b} are not a compared pair")

    def matrix(self) -> list[list[str | None]]:
        """Each pair's verdict as rows and columns in the order of `runs`; None where a run
        meets itself."""
        verdicts = {frozenset((p.a, p.b)): p.verdict for p in self.pairs}
        return [
            [None if a == b else verdicts.get(frozenset((a, b))) for b in self.runs]
            for a in self.runs
        ]


class Progress(ApiModel):
    """A running job's latest progress event: what it is (`step`, `epoch_end`, `checkpoint`,
    `interrupted`...), where training is, and the metrics it carries (as extra fields)."""

    event: str
    epoch: int | None = None
    step: int | None = None
    epochs: int | None = None
    batches: int | None = None
    loss: float | None = None


class RunLog(ApiModel):
    """A run's job log (stderr, and a script's stdout) from `start` to `end` of one attempt;
    ask again with `after=end` for what follows (`Client.follow_log` does)."""

    run_id: int
    attempt: int | None = None
    attempts: list[int] = Field(default_factory=list)
    start: int = 0
    end: int = 0
    dropped: int = 0
    text: str = ""
    running: bool = False


class RunState(ApiModel):
    """A run as the API shows it: the fields of a listing, and with `Client.run` also its
    spec, seed, metrics and verdict report."""

    id: int
    experiment_id: int
    status: str
    attempt: int = 0
    rerun_of_id: int | None = None
    family_id: int | None = None
    worker_id: int | None = None
    progress: Progress | None = None
    # Why a queued run is not being claimed (its pinned image has no live worker...).
    waiting_reason: str | None = None
    name: str | None = None  # what people call the run (`Client.edit_run`)
    tags: list[str] | None = None
    notes: str | None = None
    archived_at: datetime | None = None  # when it was archived (`Client.archive_run`)
    # The hardware class (or leading part) a worker must be of; and, for a rerun sent
    # elsewhere on request, what it was asked to run on (`Client.rerun(hardware=...)`).
    required_hardware: str | None = None
    hardware_override: str | None = None
    final_fingerprint: str | None = None
    error: dict[str, Any] | None = None
    verdict: str | None = None
    is_reference: bool = False
    audit_id: int | None = None
    created_at: datetime | None = None
    finished_at: datetime | None = None
    spec: dict[str, Any] | None = None
    spec_hash: str | None = None
    seed: list[int] | None = None
    metrics: list[dict[str, Any]] | None = None
    step_metrics: list[dict[str, Any]] | None = None  # per step: the loss every k steps
    verdict_report: Comparison | None = None
    reference_run_id: int | None = None

    @property
    def finished(self) -> bool:
        """Whether the run has ended (succeeded, failed or cancelled)."""
        return self.status in TERMINAL

    @property
    def final_metrics(self) -> dict[str, Any] | None:
        """The last recorded metrics row (loss, accuracy, ... of the last epoch), if any."""
        rows = self.metrics or []
        return rows[-1] if rows and isinstance(rows[-1], dict) else None


TERMINAL = frozenset({"succeeded", "failed", "cancelled"})


class ArrayInfo(ApiModel):
    """One named array of a dataset."""

    name: str
    dtype: str
    shape: list[int]


class StoredState(ApiModel):
    """Whether a stored file is archived, and when retention removed its bytes (pushing
    the same file again restores them)."""

    archived_at: datetime | None = None
    files_collected_at: datetime | None = None


class Dataset(StoredState):
    """A pushed dataset: its digest (what a spec's `dataset.data` names) and what it holds."""

    digest: str
    name: str
    size: int
    format: str
    samples: int
    arrays: list[ArrayInfo] = Field(default_factory=list)
    pushed_by: str | None = None
    created_at: datetime | None = None
    runs: list[int] = Field(default_factory=list)  # with `datasets.get`: runs that used it
    runs_total: int | None = None


class DatasetPage(ApiModel):
    """One page of datasets, newest first, and how many there are in all."""

    items: list[Dataset]
    total: int


class Audit(ApiModel):
    """A reproducibility audit (submit with copies): its copies and whether all agree."""

    id: int | None = None
    finished: bool
    agree: bool | None = None
    summary: str = ""
    copies: list[dict[str, Any]] = Field(default_factory=list)


class SpotCheck(ApiModel):
    """A spot check of a run: segments replayed from its checkpoints; `report` once ended."""

    id: int
    run_id: int
    # pending, verified, self-consistent (replayed by the trainer's own identity: no proof),
    # failed, no-other-worker, error
    status: str
    seed: str
    requested: int
    segments: list[dict[str, Any]] = Field(default_factory=list)
    waiting_reason: str | None = None  # while pending: why replays are not taken
    report: dict[str, Any] | None = None

    @property
    def ended(self) -> bool:
        """Whether every replay has ended and the outcome is known."""
        return self.status != "pending"


class Refinement(ApiModel):
    """A per-step re-trace of two diverged runs' divergent epoch; `report` once finished."""

    id: int
    a: int
    b: int
    epoch: int
    status: str
    runs: list[dict[str, Any]] = Field(default_factory=list)
    waiting: list[str] = Field(default_factory=list)
    report: Comparison | None = None


class ModelLayer(ApiModel):
    """One layer of a model definition, as the server's checker found it."""

    path: str
    class_name: str
    parameters: int
    config_sha256: str | None = None


class ModelDefinition(StoredState):
    """A pushed Keras model definition: its digest (what `model.definition` names)."""

    digest: str
    name: str
    size: int
    format: str
    layer_count: int
    parameter_count: int
    pushed_by: str | None = None
    created_at: datetime | None = None
    layers: list[ModelLayer] = Field(default_factory=list)  # with `models.get` and `push`
    runs: list[int] = Field(default_factory=list)
    runs_total: int | None = None


class ModelDefinitionPage(ApiModel):
    """One page of model definitions, newest first, and how many there are in all."""

    items: list[ModelDefinition]
    total: int


class CodeEntryPoint(ApiModel):
    """A component a code bundle declares: its entry-point group, name and target."""

    group: str
    name: str
    value: str


class CodeFile(ApiModel):
    """One file of a code bundle, with its digest (from the wheel's RECORD)."""

    path: str
    sha256: str
    size: int | None = None


class CodeBundle(StoredState):
    """A pushed code bundle (a wheel): its digest (what a spec's `code` names)."""

    digest: str
    name: str
    size: int
    wheel_filename: str
    entry_points: list[CodeEntryPoint] = Field(default_factory=list)
    pushed_by: str | None = None
    created_at: datetime | None = None
    files: list[CodeFile] = Field(default_factory=list)  # with `code.get` and `push`
    runs: list[int] = Field(default_factory=list)
    runs_total: int | None = None


class CodeBundlePage(ApiModel):
    """One page of code bundles, newest first, and how many there are in all."""

    items: list[CodeBundle]
    total: int


class Token(ApiModel):
    """An API token, without its secret; `token` holds the secret only when just created."""

    id: int
    name: str
    role: str
    created_at: datetime | None = None
    expires_at: datetime | None = None
    revoked_at: datetime | None = None
    last_used_at: datetime | None = None
    token: str | None = None


class AuditEvent(ApiModel):
    """One entry of the audit log: who did what to which object."""

    id: int
    at: datetime
    actor: str
    role: str
    action: str
    target_type: str
    target_id: int | None = None
    details: dict[str, Any] = Field(default_factory=dict)


class AuditLogPage(ApiModel):
    """One page of the audit log, newest first."""

    items: list[AuditEvent]
    total: int | None = None
