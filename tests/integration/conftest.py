"""Fixtures of the integration tests: a private PostgreSQL server when a test asks for one,
and `database_url`, which runs a test once on each database."""

from __future__ import annotations

import pytest

from tests.postgres import postgres_server, postgres_url

__all__ = ["database_url", "postgres_server", "postgres_url"]


@pytest.fixture(params=["sqlite", "postgresql"])
def database_url(request: pytest.FixtureRequest) -> str | None:
    """None for the embedded default (a SQLite file in the data directory), else the URL of
    the private PostgreSQL server."""
    if request.param == "sqlite":
        return None
    url: str = request.getfixturevalue("postgres_url")
    return url
