"""Fixtures of the integration tests: a private PostgreSQL server when a test asks for one,
`database_url`, which runs a test once on each database, and `migrated_settings`, the
settings of an app on such a database, migrated."""

from __future__ import annotations

from pathlib import Path

import pytest

from service.config import Settings
from service.persistence.migrate import upgrade
from tests.postgres import postgres_server, postgres_url

__all__ = ["database_url", "migrated_settings", "postgres_server", "postgres_url"]


@pytest.fixture(params=["sqlite", "postgresql"])
def database_url(request: pytest.FixtureRequest) -> str | None:
    """None for the embedded default (a SQLite file in the data directory), else the URL of
    the private PostgreSQL server."""
    if request.param == "sqlite":
        return None
    url: str = request.getfixturevalue("postgres_url")
    return url


@pytest.fixture
def migrated_settings(database_url: str | None, tmp_path: Path) -> Settings:
    """Settings with a data directory of the test's own, on each database in turn, with the
    database migrated."""
    settings = Settings(data_dir=tmp_path / "data", database_url=database_url or "")
    upgrade(settings.resolved_database_url)
    return settings
