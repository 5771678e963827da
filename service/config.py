"""Service settings, from `REPRO_*` environment variables (pydantic-settings)."""

from __future__ import annotations

import functools
import math
from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    """Everything an operator can configure; defaults run on a laptop with SQLite."""

    model_config = SettingsConfigDict(env_prefix="REPRO_", extra="ignore")

    data_dir: Path = Field(default_factory=lambda: Path.home() / ".reprotrain")
    # Empty: a SQLite file in the data directory. Production: postgresql+psycopg://...
    database_url: str = ""
    artifacts_dir: Path | None = None
    # Where stored bytes live: empty, the data directory (artifacts_dir); `s3://bucket/prefix`,
    # an S3-compatible store that several API replicas share (service.storage.s3_store).
    # Its endpoint and credentials are boto3's usual settings (AWS_ENDPOINT_URL,
    # AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_DEFAULT_REGION) or the two below.
    storage_url: str = Field(
        default="", pattern=r"^(s3://[a-z0-9][a-z0-9.-]{1,61}[a-z0-9](/.*)?)?$"
    )
    s3_endpoint_url: str | None = None
    # The store's address in the presigned URLs workers and browsers get, when it is not the
    # one the API uses (a proxy, another network).
    s3_public_endpoint_url: str | None = None
    s3_addressing_style: Literal["auto", "path", "virtual"] = "auto"
    # How long a presigned URL works: an upload or download must start within it.
    s3_presign_seconds: int = Field(default=900, ge=10, le=7 * 24 * 3600)
    host: str = "127.0.0.1"
    port: int = 8000
    lease_seconds: float = Field(default=30.0, gt=0)
    # A worker renews each lease every heartbeat period; a training's progress (epoch, step,
    # loss) goes out with it, and between two renewals at most once a progress period. Each
    # is one small request: a fleet of N training jobs sends about N / progress_seconds a
    # second (benchmarks/fleet.py measures what one API process sustains).
    heartbeat_seconds: float = Field(default=10.0, gt=0)
    progress_seconds: float = Field(default=5.0, gt=0)
    max_attempts: int = Field(default=5, ge=1)
    # How long a multi-host run's gang may take to complete once its first worker joined;
    # then its members are let go (they claim other work) and it waits for enough idle ones.
    gang_form_seconds: float = Field(default=120.0, gt=0)
    # For this long after an API process starts it requeues no run whose lease lapsed: the
    # workers that kept training while the API was away get time to renew. None: twice the
    # lease.
    lease_grace_seconds: float | None = Field(default=None, ge=0)
    max_body_bytes: int = Field(default=1_000_000, ge=1024)
    max_artifact_bytes: int = Field(default=8 * 1024**3, ge=1024)
    # A dataset upload (`POST /api/v1/datasets`), counted as its bytes arrive.
    max_dataset_bytes: int = Field(default=2 * 1024**3, ge=1024)
    # What a dataset's arrays may take once inflated, read from the zip's declared sizes before
    # anything is inflated: a compressed upload may declare far more than it sends.
    max_dataset_inflated_bytes: int = Field(default=2 * 1024**3, ge=1024)
    # A pushed model definition (Keras JSON, or a .keras archive whose config.json alone is
    # read): bytes of the push and of its config, JSON nesting, and layers. A ResNet-50's
    # config is about 0.3 MB, 20 levels deep and 180 layers.
    max_model_definition_bytes: int = Field(default=4 * 1024**2, ge=1024)
    max_model_definition_depth: int = Field(default=64, ge=8, le=1000)
    max_model_definition_layers: int = Field(default=2_000, ge=1)
    # Code bundles (`POST /api/v1/code`, a spec's `code`): off refuses pushes and specs that
    # name one (422). The wheel's bytes as they arrive, its files, and those files inflated,
    # the last two read from the zip's directory before anything is inflated.
    allow_code_bundles: bool = True
    max_code_bundle_bytes: int = Field(default=64 * 1024**2, ge=1024)
    max_code_bundle_files: int = Field(default=2000, ge=1)
    max_code_bundle_inflated_bytes: int = Field(default=256 * 1024**2, ge=1024)
    # What the arrays of one checkpoint may declare in total, checked before any is read.
    max_checkpoint_bytes: int = Field(default=4 * 1024**3, ge=1024)
    # Reports of compared pairs kept besides a family's (a rerun against its reference), so
    # viewers comparing any pairs cannot grow the database with runs squared; past it the
    # oldest go and are computed again when asked. 0: only a family's are kept.
    max_stored_comparisons: int = Field(default=1000, ge=0)
    # Runs one N-way comparison may name (API and dashboard): its pairs grow with N squared,
    # and each run's trace and metrics are read, so past it the request is refused (422).
    max_compare_runs: int = Field(default=20, ge=2, le=200)
    # Checkpoints a finished run keeps for spot checks and refinements: "all" (every epoch
    # checkpoint), "every:N" (epochs N, 2N, ... and the last) or "final" (the last only; no
    # spot check then). Each kept one costs the model's state in bytes (see the README).
    keep_checkpoints: str = Field(default="all", pattern=r"^(all|final|every:[1-9][0-9]{0,5})$")
    # Segments every successful training gets spot-checked on automatically; 0: on request.
    spot_check_segments: int = Field(default=0, ge=0, le=1000)
    # Segments one spot check may ask for: each is a job on a worker.
    max_spot_check_segments: int = Field(default=50, ge=1, le=10_000)
    # A segment's replay goes only to a worker of another identity (worker token) than the
    # one that trained the run, unless the request allows the trainer. Past this wait with
    # no such worker live that could take it, the replay is cancelled and the check ends
    # `no-other-worker`; it never falls back to the trainer.
    spot_check_other_worker_seconds: float = Field(default=120.0, ge=0)
    # Spot checks of one run not yet ended: the next request is refused (409), so requests
    # cannot queue replays without bound.
    max_pending_spot_checks_per_run: int = Field(default=4, ge=1, le=1000)
    # Metric names per run whose final values are kept for sorting the runs page (one row
    # each); a result naming more keeps them all in its metrics, sortable by the first ones.
    max_sortable_metrics: int = Field(default=64, ge=1, le=10_000)
    # Days an archived run keeps its files (checkpoints, model, log) before `repro admin
    # collect` removes them; a family's reference keeps them while its reruns are not archived.
    archive_retention_days: float = Field(default=30, ge=0, le=36_500)
    # A job's log (its stderr, and a script's stdout) kept per attempt: past it the oldest
    # pieces go, so the end of the log, where errors are, stays.
    max_log_bytes: int = Field(default=1024**2, ge=4096)
    # A worker's result (`POST /runs/{id}/complete`): its body limit. A spec whose result
    # could exceed it (mostly its fingerprint trace: points x variables) is refused at submit.
    max_result_bytes: int = Field(default=64 * 1024**2, ge=1024)
    # Files one run may hold per artifact kind (log, weights, model, and checkpoint files
    # beyond the epoch checkpoints its spec writes), and their bytes per kind; past either
    # an upload is refused (413) before it is stored.
    max_run_artifact_files: int = Field(default=64, ge=1)
    max_run_artifact_bytes: int = Field(default=16 * 1024**3, ge=1024)
    # Images a worker may advertise or report running (empty: any, recorded as reported).
    worker_images: list[str] = Field(default_factory=list)
    # Worker names one worker token may hold (registering the next one: 409), and images one
    # worker may advertise (422); each stored worker is shown in lists and pages.
    max_workers_per_token: int = Field(default=256, ge=1)
    # Workers one bootstrap token may enroll, each with a credential of its own (live ones
    # count: a revoked or expired credential frees its place).
    max_enrollments_per_token: int = Field(default=10_000, ge=1)
    max_worker_images: int = Field(default=64, ge=1, le=1000)
    # Reproducibility flags (`repro doctor`'s) one worker may report at registration (422).
    max_worker_flags: int = Field(default=32, ge=1, le=256)
    # Slow clients: a request's headers must arrive within header_timeout_seconds of the
    # connection (or of its previous response); its body within body_timeout_seconds, plus
    # one second per body_min_bytes_per_second received (so a large upload at a steady rate
    # finishes, a trickle does not). Past either: 408 and the connection closes.
    header_timeout_seconds: float = Field(default=10.0, gt=0)
    body_timeout_seconds: float = Field(default=30.0, gt=0)
    body_min_bytes_per_second: int = Field(default=64 * 1024, ge=1)
    # Bounds on the work one spec may ask for; the operator tunes them.
    max_epochs: int = Field(default=10_000, ge=1)
    max_batch_size: int = Field(default=65_536, ge=1)
    max_batches_per_epoch: int = Field(default=1_000_000, ge=1)
    max_total_steps: int = Field(default=10_000_000, ge=1)
    max_model_parameters: int = Field(default=500_000_000, ge=1)
    # Values in a model definition's largest tensor for one batch (values per example x
    # batch_size): 2**28 (1 GiB of float32) matches max_batch_elements, the largest input
    # batch; resnet20 at batch 128 holds 2**21. Refused at push (one example), at submit
    # and in the job before Keras allocates anything.
    max_activation_elements: int = Field(default=2**28, ge=1)
    # Replicas (devices) one run may ask for; a spec allows at most 64.
    max_replicas: int = Field(default=64, ge=1)
    # Threads a spec may ask a worker for, per setting (intra-op, inter-op, parallel calls
    # of the input pipeline); workers refuse more than 256 whatever this says.
    max_threads: int = Field(default=64, ge=1)
    # Input values in one batch (batch_size x sample size); workers refuse more than 2**28.
    max_batch_elements: int = Field(default=2**28, ge=1)
    # Invalid bearer tokens tolerated per client address and window before 429.
    auth_failures_allowed: int = Field(default=20, ge=1)
    auth_failure_window_seconds: float = Field(default=60.0, gt=0)
    # Invalid tokens per client address and window whatever token ids they claim, so a new
    # id per attempt does not escape the limit; valid tokens are verified first and pass.
    auth_failures_per_address: int = Field(default=100, ge=1)
    # A valid token is trusted again for this long without reading its row; a revocation
    # takes effect at once on the process that made it, within this bound on the others.
    # 0: every request reads the token's row.
    token_cache_seconds: float = Field(default=5.0, ge=0, le=300)
    # Requests that wait on the server hold neither a thread nor a database connection, so
    # these bound only memory and sockets; past them: 503 with Retry-After.
    max_event_streams: int = Field(default=1000, ge=1)
    max_waiting_claims: int = Field(default=1000, ge=1)
    # Waiting claims one token may hold, so one worker token cannot take every slot.
    max_waiting_claims_per_token: int = Field(default=250, ge=1)
    # Database connections per API process (PostgreSQL; SQLite uses a pool as large as the
    # thread pool): at least the thread pool's 40, so no request thread waits for one. The
    # pool keeps as many as it has needed, up to `db_pool_size`, and closes the overflow on
    # return: with a kept pool smaller than the requests in flight, steady load opened and
    # closed a server connection every few requests.
    db_pool_size: int = Field(default=40, ge=1)
    db_max_overflow: int = Field(default=10, ge=0)
    db_pool_timeout_seconds: float = Field(default=10.0, gt=0)
    # PostgreSQL connections of the hot reads (a run, a page of runs), which wait for the
    # database on the event loop (service.api.reads): a pool of their own, on top of the
    # above. Requests past it wait for a free one, without holding a thread.
    db_read_pool_size: int = Field(default=10, ge=1)
    # How long a migrator of a PostgreSQL database (`repro db upgrade`, a server migrating on
    # start) waits for another one's lock before it fails, naming this setting: a migrator
    # stuck mid-migration then fails a deployment's migration step instead of hanging it.
    migration_lock_timeout_seconds: float = 300.0
    # /metrics answers without a token by default (aggregate numbers only, as Prometheus
    # scrapers expect); when True it asks for a token with the read role.
    metrics_token_required: bool = False
    # /metrics labels the queue by required image for per-pool autoscaling. Images come from
    # specs, so only this many (the most queued and running) get a series each; the rest are
    # summed under image="other", keeping the scrape bounded whatever users submit.
    metrics_max_image_labels: int = Field(default=50, ge=1, le=10_000)
    # Dashboard sessions: signed with this secret when set (several API replicas must share
    # one), else with a secret created on first start in the data directory (owner-only).
    dashboard_secret: str = Field(default="", repr=False)
    dashboard_session_hours: float = Field(default=12.0, gt=0, le=24 * 30)
    # Provenance records every environment variable outside the numerics list by name and
    # an HMAC-SHA256 of its value under this key, sent to workers with each claim (several
    # API replicas must share one); empty: a key created on first start in the data directory.
    provenance_key: str = Field(default="", repr=False)
    # Variables whose values provenance records, beyond the built-in list of those known to
    # change numerics: names or NAME* prefixes, comma-separated (or a JSON list).
    numeric_env_vars: str = ""

    @field_validator("numeric_env_vars")
    @classmethod
    def _variable_names(cls, value: str) -> str:
        from worker.record.environment_capture import parse_name_list

        return ",".join(parse_name_list(value))

    @field_validator("migration_lock_timeout_seconds", mode="before")
    @classmethod
    def _positive_seconds(cls, value: object) -> object:
        # Before pydantic's own parsing, so that every refusal (not a number, zero, negative,
        # inf, nan) names the variable an operator sets; blank means the default.
        text = str(value).strip()
        if not text:
            return cls.model_fields["migration_lock_timeout_seconds"].default
        try:
            seconds = float(text)
        except ValueError:
            seconds = math.nan
        if not (math.isfinite(seconds) and seconds > 0):
            raise ValueError(
                "REPRO_MIGRATION_LOCK_TIMEOUT_SECONDS must be a positive number of seconds, "
                f"not {text!r}"
            )
        return seconds

    @property
    def resolved_lease_grace_seconds(self) -> float:
        """How long a starting API process leaves lapsed leases alone."""
        if self.lease_grace_seconds is not None:
            return self.lease_grace_seconds
        return 2 * self.lease_seconds

    @property
    def resolved_database_url(self) -> str:
        """The database URL in use (the embedded SQLite file when none is configured)."""
        return self.database_url or f"sqlite:///{self.data_dir / 'reprotrain.db'}"

    @property
    def resolved_artifacts_dir(self) -> Path:
        """Where uploaded artifacts are stored."""
        return self.artifacts_dir or self.data_dir / "artifacts"

    @property
    def resolved_datasets_dir(self) -> Path:
        """Where pushed datasets are stored, named by digest (beside the artifacts)."""
        return self.resolved_artifacts_dir / "datasets"


@functools.cache
def get_settings() -> Settings:
    """The process-wide settings, read once."""
    return Settings()
