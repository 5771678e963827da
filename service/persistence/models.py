"""Database models (SQLAlchemy 2, typed). Times are naive UTC."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, ClassVar

from sqlalchemy import (
    JSON,
    BigInteger,
    Float,
    ForeignKey,
    Index,
    String,
    Text,
    UniqueConstraint,
    false,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship

RUN_STATUSES = ("queued", "running", "succeeded", "failed", "cancelled")
TERMINAL_STATUSES = frozenset({"succeeded", "failed", "cancelled"})


def utcnow() -> datetime:
    """Now, as the naive UTC datetime every table stores."""
    return datetime.now(UTC).replace(tzinfo=None)


class Base(DeclarativeBase):
    type_annotation_map: ClassVar[dict[Any, Any]] = {dict[str, Any]: JSON, list[Any]: JSON}


class Experiment(Base):
    """A validated spec with its resolved seed; runs are trainings of it."""

    __tablename__ = "experiments"

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(200), index=True)  # its project (/projects)
    spec: Mapped[dict[str, Any]]  # the spec with its seed resolved
    spec_hash: Mapped[str] = mapped_column(String(80), index=True)
    submitted_spec_hash: Mapped[str] = mapped_column(String(80))
    seed: Mapped[list[Any]]
    seed_source: Mapped[str] = mapped_column(String(20))
    image: Mapped[str | None] = mapped_column(String(500))
    idempotency_key: Mapped[str | None] = mapped_column(String(200), unique=True)
    request_hash: Mapped[str | None] = mapped_column(String(80))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    # The spec's model definition and code bundle digests: "which runs used it" by index.
    model_digest: Mapped[str | None] = mapped_column(String(80), index=True)
    code_digest: Mapped[str | None] = mapped_column(String(80), index=True)
    # When it was archived with its ended runs (None: it is not): lists leave it out.
    archived_at: Mapped[datetime | None]

    runs: Mapped[list[Run]] = relationship(back_populates="experiment", order_by="Run.id")


class ApiToken(Base):
    """A bearer token: only its hash is stored; the secret is shown once, at creation."""

    __tablename__ = "api_tokens"

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(200))
    role: Mapped[str] = mapped_column(String(20))
    secret_hash: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    created_by_id: Mapped[int | None] = mapped_column(ForeignKey("api_tokens.id"))
    expires_at: Mapped[datetime | None]
    revoked_at: Mapped[datetime | None]
    last_used_at: Mapped[datetime | None]
    # When a worker last claimed a run this token queued: claims go to the submitter served
    # least recently (service.runs.queue.claim).
    queue_turn_at: Mapped[datetime | None]


class LoginCode(Base):
    """A one-time dashboard login code (only its hash), the token it logs in as, and until
    when: in the database, so that any API process redeems a code another one issued."""

    __tablename__ = "login_codes"

    code_hash: Mapped[str] = mapped_column(String(64), primary_key=True)
    token_id: Mapped[int] = mapped_column(ForeignKey("api_tokens.id", ondelete="CASCADE"))
    expires_at: Mapped[datetime]


class AuditEvent(Base):
    """Who did what to which resource, and when."""

    __tablename__ = "audit_events"

    id: Mapped[int] = mapped_column(primary_key=True)
    at: Mapped[datetime] = mapped_column(default=utcnow, index=True)
    token_id: Mapped[int | None] = mapped_column(ForeignKey("api_tokens.id"))
    actor: Mapped[str] = mapped_column(String(200))
    role: Mapped[str] = mapped_column(String(20))
    action: Mapped[str] = mapped_column(String(40), index=True)
    target_type: Mapped[str] = mapped_column(String(40))
    target_id: Mapped[int | None]
    details: Mapped[dict[str, Any]]


class Worker(Base):
    """A registered worker agent and what it can run."""

    __tablename__ = "workers"
    __table_args__ = (UniqueConstraint("name", name="uq_workers_name"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    # The worker token that registered it: only that token may act as this worker.
    token_id: Mapped[int | None] = mapped_column(
        ForeignKey("api_tokens.id", name="fk_workers_token_id")
    )
    # A worker's identity: one name, one token (re-trace runs are pinned to it by name).
    name: Mapped[str] = mapped_column(String(200))
    hostname: Mapped[str] = mapped_column(String(200), default="")
    executors: Mapped[list[Any]]
    images: Mapped[list[Any]]
    gpu: Mapped[str | None] = mapped_column(String(200))
    # Devices a job may train on: GPUs the node counted, and for a CPU-only node the logical
    # CPU devices it allows; `devices` (GPUs, else CPU devices) bounds the replicas it claims.
    gpus: Mapped[int] = mapped_column(default=0, server_default="0")
    cpu_devices: Mapped[int | None]
    devices: Mapped[int] = mapped_column(default=1, server_default="1")
    # The worker runs code bundles (a sandboxed executor, or an operator's explicit opt-in).
    accepts_code: Mapped[bool] = mapped_column(default=False, server_default=false())
    # Its hardware class (worker.record.hardware): runs requiring a class go only to workers
    # of it; and the pool it belongs to (REPRO_WORKER_POOL), a label of its held runs.
    hardware_class: Mapped[str | None] = mapped_column(String(300))
    pool: Mapped[str | None] = mapped_column(String(200))
    # What the reproducibility checks flagged when the worker started ([{"check", "message"}]);
    # None when its agent did not run them.
    readiness_flags: Mapped[list[Any] | None]
    registered_at: Mapped[datetime] = mapped_column(default=utcnow)
    last_seen_at: Mapped[datetime] = mapped_column(default=utcnow)
    # When it last asked to join a gang (it can, and was idle then); None: it never did.
    gang_seen_at: Mapped[datetime | None]


class Run(Base):
    """One training of an experiment; a rerun is a run with `rerun_of_id` set."""

    __tablename__ = "runs"
    __table_args__ = (
        Index("ix_runs_status_id", "status", "id"),  # the claim: oldest queued first
        Index("ix_runs_kind_id", "kind", "id"),  # the runs page, newest first
        Index("ix_runs_kind_status_id", "kind", "status", "id"),  # ... filtered by status
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    experiment_id: Mapped[int] = mapped_column(ForeignKey("experiments.id"), index=True)
    rerun_of_id: Mapped[int | None] = mapped_column(ForeignKey("runs.id"))
    # The original run of the family: every rerun of a rerun points at the same root.
    family_id: Mapped[int | None] = mapped_column(ForeignKey("runs.id"), index=True)
    status: Mapped[str] = mapped_column(String(20), default="queued")
    attempt: Mapped[int] = mapped_column(default=0)
    required_image: Mapped[str | None] = mapped_column(String(500))
    worker_id: Mapped[int | None] = mapped_column(ForeignKey("workers.id"))
    lease_expires_at: Mapped[datetime | None]
    # A queued run whose lease lapsed: the worker that held it, which may take it back on
    # the same attempt until another worker claims it (service.runs.queue.held_run).
    lapsed_holder_id: Mapped[int | None] = mapped_column(
        ForeignKey("workers.id", name="fk_runs_lapsed_holder_id")
    )
    heartbeat_at: Mapped[datetime | None]
    progress: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    started_at: Mapped[datetime | None]
    finished_at: Mapped[datetime | None]
    final_fingerprint: Mapped[str | None] = mapped_column(String(100))
    trace_granularity: Mapped[str | None] = mapped_column(String(40))
    provenance: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    metrics: Mapped[list[Any] | None] = mapped_column(JSON)
    # The result's per-step rows (the loss every k steps, a script's step metrics): curves.
    step_metrics: Mapped[list[Any] | None] = mapped_column(JSON)
    data_fingerprints: Mapped[list[Any] | None] = mapped_column(JSON)
    result_summary: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    error: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    # "train" for trainings of the experiment; "refine" for a re-trace of part of a run.
    kind: Mapped[str] = mapped_column(String(20), default="train", server_default="train")
    # Options for the job beyond its spec (a re-trace's epochs, granularity, starting point).
    job_options: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    # Only the worker of this name may claim the run (a re-trace runs where its run ran).
    required_worker: Mapped[str | None] = mapped_column(String(200))
    # The first run of a reproducibility audit: its copies run on different workers.
    audit_id: Mapped[int | None] = mapped_column(ForeignKey("runs.id"), index=True)
    # Who reported the result (worker, token), the image it reported and how the server
    # checked the report (its recomputed final fingerprint, the image allow-list).
    reported_by: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    # The spec's distribution.replicas, copied at submit: a claim compares it with devices.
    replicas: Mapped[int] = mapped_column(default=1, server_default="1")
    # Workers that train it together (`distribution.hosts`): more than one is a gang's run.
    hosts: Mapped[int] = mapped_column(default=1, server_default="1")
    # The gang of its latest attempt, by rank (`gangs.record`): the provenance of every member.
    gang: Mapped[list[Any] | None] = mapped_column(JSON)
    # The global step of the checkpoint the finishing attempt resumed from (None: from scratch).
    resumed_from_step: Mapped[int | None]
    # The spec names a code bundle: only a worker that accepts code may claim the run.
    needs_code: Mapped[bool] = mapped_column(default=False, server_default=false())
    # The newest spot check's outcome ("pending", "verified", "failed"), for the runs list.
    spot_check: Mapped[str | None] = mapped_column(String(20))
    # A spot check's replay is never claimed by this worker identity, the trainer's (see
    # service.verification.replay_identity; a worker name in rows queued before identities).
    avoid_worker: Mapped[str | None] = mapped_column(String(200))
    # The token that queued the run (None: queued by the server itself, or before tokens
    # were recorded); claims are fair across submitters.
    submitter_id: Mapped[int | None] = mapped_column(
        ForeignKey("api_tokens.id", name="fk_runs_submitter_id")
    )
    # Claims take higher priorities first; only an admin sets one above 0.
    priority: Mapped[int] = mapped_column(default=0, server_default="0")
    # "worker": trained by a worker; "by_hand": a script run by hand that recorded itself
    # here (never claimed; its rerun trains on a worker).
    origin: Mapped[str] = mapped_column(String(20), default="worker", server_default="worker")
    # What people call the run, their notes, and its tags (also one row each in run_tags,
    # which the runs list filters by); set with PATCH /runs/{id}.
    name: Mapped[str | None] = mapped_column(String(200))
    notes: Mapped[str | None] = mapped_column(Text)
    tags: Mapped[list[str] | None] = mapped_column(JSON)
    # When the run was archived (None: it is not): lists leave it out unless asked.
    archived_at: Mapped[datetime | None]
    # When retention removed its files (checkpoints, model, log); its record stays.
    files_collected_at: Mapped[datetime | None]
    # The hardware class (or a leading part of one: "gpu") a worker must be of to claim it:
    # the spec's `environment.hardware`, or for a rerun its run's class; `hardware_override`
    # holds what a rerun was asked to run on instead ("any" or a class), else None.
    required_hardware: Mapped[str | None] = mapped_column(String(300))
    hardware_override: Mapped[str | None] = mapped_column(String(300))

    experiment: Mapped[Experiment] = relationship(back_populates="runs")
    verdict_record: Mapped[Verdict | None] = relationship(
        back_populates="run", foreign_keys="Verdict.run_id", uselist=False
    )


class GangMember(Base):
    """A worker in the gang of a multi-host run's attempt: it joins while the run waits for
    enough workers (no rank yet) and is ranked when the gang is complete and the run starts.
    A worker is in one gang at most."""

    __tablename__ = "gang_members"
    __table_args__ = (UniqueConstraint("worker_id", name="uq_gang_members_worker_id"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    run_id: Mapped[int] = mapped_column(
        ForeignKey("runs.id", name="fk_gang_members_run_id"), index=True
    )
    attempt: Mapped[int]  # the attempt the gang trains
    worker_id: Mapped[int] = mapped_column(
        ForeignKey("workers.id", name="fk_gang_members_worker_id")
    )
    address: Mapped[str] = mapped_column(String(300))  # host:port the others reach it at
    rank: Mapped[int | None]
    joined_at: Mapped[datetime] = mapped_column(default=utcnow)
    seen_at: Mapped[datetime] = mapped_column(default=utcnow)
    done_at: Mapped[datetime | None]  # its job ended well: no longer heartbeating


class ExperimentParam(Base):
    """One leaf field of an experiment's spec (`training.optimizer.params.learning_rate`),
    for searching runs by parameter on an index: numbers in `num`, anything else as text."""

    __tablename__ = "experiment_params"
    __table_args__ = (
        Index("ix_experiment_params_name_num", "name", "num", "experiment_id"),
        Index("ix_experiment_params_name_text", "name", "text", "experiment_id"),
    )

    experiment_id: Mapped[int] = mapped_column(
        ForeignKey("experiments.id", name="fk_experiment_params_experiment_id"), primary_key=True
    )
    name: Mapped[str] = mapped_column(String(200), primary_key=True)
    num: Mapped[float | None] = mapped_column(Float)
    text: Mapped[str | None] = mapped_column(String(200))


class RunTag(Base):
    """One tag of a run, for the runs list's `tag` filter (the run's `tags` list shows them)."""

    __tablename__ = "run_tags"
    __table_args__ = (Index("ix_run_tags_tag_run_id", "tag", "run_id"),)

    run_id: Mapped[int] = mapped_column(
        ForeignKey("runs.id", name="fk_run_tags_run_id"), primary_key=True
    )
    tag: Mapped[str] = mapped_column(String(64), primary_key=True)


class TracePointRow(Base):
    """One fingerprint trace point of a run."""

    __tablename__ = "trace_points"
    __table_args__ = (UniqueConstraint("run_id", "seq"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id"), index=True)
    seq: Mapped[int]
    kind: Mapped[str] = mapped_column(String(10))
    epoch: Mapped[int]
    step: Mapped[int]
    fingerprint: Mapped[str] = mapped_column(String(100))
    variables: Mapped[dict[str, Any]]


class Artifact(Base):
    """A file a worker uploaded for a run, stored under its verified digest."""

    __tablename__ = "artifacts"
    __table_args__ = (UniqueConstraint("run_id", "kind", "name"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id"), index=True)
    kind: Mapped[str] = mapped_column(String(20))
    name: Mapped[str] = mapped_column(String(200))
    epoch: Mapped[int | None]
    sha256: Mapped[str] = mapped_column(String(64))
    size: Mapped[int] = mapped_column(BigInteger)
    storage_url: Mapped[str] = mapped_column(Text)
    attempt: Mapped[int]
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class Verdict(Base):
    """A finished rerun compared with its family's reference run."""

    __tablename__ = "verdicts"

    id: Mapped[int] = mapped_column(primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id"), unique=True)
    reference_run_id: Mapped[int] = mapped_column(ForeignKey("runs.id"))
    verdict: Mapped[str] = mapped_column(String(20), index=True)
    report: Mapped[dict[str, Any]]
    created_at: Mapped[datetime] = mapped_column(default=utcnow)

    run: Mapped[Run] = relationship(back_populates="verdict_record", foreign_keys=[run_id])


class Refinement(Base):
    """A per-step re-trace of the divergent epoch of two runs, from their last common state."""

    __tablename__ = "refinements"

    id: Mapped[int] = mapped_column(primary_key=True)
    run_a_id: Mapped[int] = mapped_column(ForeignKey("runs.id"))
    run_b_id: Mapped[int] = mapped_column(ForeignKey("runs.id"))
    epoch: Mapped[int]  # the epoch re-traced step by step
    from_epoch: Mapped[int]  # the checkpoint both re-traces start from (0: from scratch)
    refine_a_id: Mapped[int] = mapped_column(ForeignKey("runs.id"))
    refine_b_id: Mapped[int] = mapped_column(ForeignKey("runs.id"))
    report: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class SpotCheck(Base):
    """K segments of a finished run replayed from its kept checkpoints, compared bit for bit."""

    __tablename__ = "spot_checks"

    id: Mapped[int] = mapped_column(primary_key=True)
    run_id: Mapped[int] = mapped_column(
        ForeignKey("runs.id", name="fk_spot_checks_run_id"), index=True
    )
    seed: Mapped[int] = mapped_column(BigInteger)  # chose the segments: the choice reproduces
    requested: Mapped[int]  # K, as asked
    # [{"index", "from_epoch", "to_epoch", "run_id"}]: the chosen segments and their replays.
    segments: Mapped[list[Any]]
    status: Mapped[str] = mapped_column(String(20))  # pending, verified, failed, error
    report: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    requested_by: Mapped[str | None] = mapped_column(String(200))  # a token's name; None: policy
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    finished_at: Mapped[datetime | None]


class ComparisonRecord(Base):
    """A comparison report of two finished runs, kept: finished runs never change."""

    __tablename__ = "comparison_reports"
    __table_args__ = (UniqueConstraint("run_a_id", "run_b_id", name="uq_comparison_reports_ab"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    run_a_id: Mapped[int] = mapped_column(ForeignKey("runs.id"))
    run_b_id: Mapped[int] = mapped_column(ForeignKey("runs.id"))
    report: Mapped[dict[str, Any]]
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class _Archived:
    """When a stored file was archived (lists leave it out, new experiments may not name
    it) and when retention removed its bytes (its record stays; pushing them restores it)."""

    archived_at: Mapped[datetime | None]
    files_collected_at: Mapped[datetime | None]


class Dataset(_Archived, Base):
    """A pushed dataset file, stored content-addressed under its SHA-256 digest."""

    __tablename__ = "datasets"

    id: Mapped[int] = mapped_column(primary_key=True)
    digest: Mapped[str] = mapped_column(String(80), unique=True)  # "sha256:<hex>"
    name: Mapped[str] = mapped_column(String(200))
    size: Mapped[int] = mapped_column(BigInteger)
    format: Mapped[str] = mapped_column(String(40))
    samples: Mapped[int] = mapped_column(BigInteger)
    arrays: Mapped[list[Any]]  # [{"name", "shape", "dtype"}], as the reader found them
    storage_url: Mapped[str] = mapped_column(Text)
    pushed_by_id: Mapped[int | None] = mapped_column(
        ForeignKey("api_tokens.id", name="fk_datasets_pushed_by_id")
    )
    pushed_by: Mapped[str] = mapped_column(String(200))  # the token's name, kept if revoked
    created_at: Mapped[datetime] = mapped_column(default=utcnow, index=True)


class _Pushed:
    """Columns of a file a user pushed once and the server stores by content digest."""

    storage_url: Mapped[str] = mapped_column(Text)
    pushed_by: Mapped[str] = mapped_column(String(200))  # the token's name, kept if revoked
    created_at: Mapped[datetime] = mapped_column(default=utcnow, index=True)


class ModelDefinition(_Pushed, _Archived, Base):
    """A Keras model architecture, checked against the allow-list and stored by digest."""

    __tablename__ = "model_definitions"

    id: Mapped[int] = mapped_column(primary_key=True)
    digest: Mapped[str] = mapped_column(String(80), unique=True)  # "sha256:<hex>"
    name: Mapped[str] = mapped_column(String(200))
    size: Mapped[int] = mapped_column(BigInteger)
    format: Mapped[str] = mapped_column(String(40))  # "keras_json" or "keras_archive"
    layer_count: Mapped[int]
    parameter_count: Mapped[int] = mapped_column(BigInteger)
    layers: Mapped[list[Any]]  # [{"path", "class_name", ...}], as the checker found them
    pushed_by_id: Mapped[int | None] = mapped_column(
        ForeignKey("api_tokens.id", name="fk_model_definitions_pushed_by_id")
    )


class CodeBundle(_Pushed, _Archived, Base):
    """A wheel of user code (layers, generators, losses), stored by digest."""

    __tablename__ = "code_bundles"

    id: Mapped[int] = mapped_column(primary_key=True)
    digest: Mapped[str] = mapped_column(String(80), unique=True)  # "sha256:<hex>"
    name: Mapped[str] = mapped_column(String(200))
    size: Mapped[int] = mapped_column(BigInteger)
    wheel_filename: Mapped[str] = mapped_column(String(300))
    files: Mapped[list[Any]]  # [{"path", "sha256", "size"}], the wheel's manifest
    entry_points: Mapped[list[Any]]  # [{"group", "name", "value"}]
    pushed_by_id: Mapped[int | None] = mapped_column(
        ForeignKey("api_tokens.id", name="fk_code_bundles_pushed_by_id")
    )


class RunLogChunk(Base):
    """A piece of a job's log (its stderr, and a script's stdout) as its worker sent it with
    a heartbeat: `offset` is where it starts in that attempt's log, so a repeated heartbeat
    adds nothing. The oldest pieces of an attempt go once it holds more than the bound."""

    __tablename__ = "run_log_chunks"

    run_id: Mapped[int] = mapped_column(
        ForeignKey("runs.id", name="fk_run_log_chunks_run_id"), primary_key=True
    )
    attempt: Mapped[int] = mapped_column(primary_key=True)
    offset: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    text: Mapped[str] = mapped_column(Text)
    size: Mapped[int]  # bytes of `text` in UTF-8


class RunMetric(Base):
    """A run's final value of one recorded metric, so the runs page sorts by it on an index."""

    __tablename__ = "run_metrics"
    __table_args__ = (Index("ix_run_metrics_name_value_run", "name", "value", "run_id"),)

    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id"), primary_key=True)
    name: Mapped[str] = mapped_column(String(200), primary_key=True)
    value: Mapped[float] = mapped_column(Float)
