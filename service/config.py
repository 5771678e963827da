"""Service settings, from `REPRO_*` environment variables (pydantic-settings)."""

from __future__ import annotations

import functools
from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    """Everything an operator can configure; defaults run on a laptop with SQLite."""

    model_config = SettingsConfigDict(env_prefix="REPRO_", extra="ignore")

    data_dir: Path = Field(default_factory=lambda: Path.home() / ".reprotrain")
    # Empty: a SQLite file in the data directory. Production: postgresql+psycopg://...
    database_url: str = ""
    artifacts_dir: Path | None = None
    host: str = "127.0.0.1"
    port: int = 8000
    lease_seconds: float = Field(default=30.0, gt=0)
    heartbeat_seconds: float = Field(default=10.0, gt=0)
    max_attempts: int = Field(default=5, ge=1)
    max_body_bytes: int = Field(default=1_000_000, ge=1024)
    max_artifact_bytes: int = Field(default=8 * 1024**3, ge=1024)
    # Bounds on the work one spec may ask for; the operator tunes them.
    max_epochs: int = Field(default=10_000, ge=1)
    max_batch_size: int = Field(default=65_536, ge=1)
    max_batches_per_epoch: int = Field(default=1_000_000, ge=1)
    max_total_steps: int = Field(default=10_000_000, ge=1)
    max_model_parameters: int = Field(default=500_000_000, ge=1)
    # Invalid bearer tokens tolerated per client address and window before 429.
    auth_failures_allowed: int = Field(default=20, ge=1)
    auth_failure_window_seconds: float = Field(default=60.0, gt=0)

    @property
    def resolved_database_url(self) -> str:
        """The database URL in use (the embedded SQLite file when none is configured)."""
        return self.database_url or f"sqlite:///{self.data_dir / 'reprotrain.db'}"

    @property
    def resolved_artifacts_dir(self) -> Path:
        """Where uploaded artifacts are stored."""
        return self.artifacts_dir or self.data_dir / "artifacts"


@functools.cache
def get_settings() -> Settings:
    """The process-wide settings, read once."""
    return Settings()
