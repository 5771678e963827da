"""Migrations build the schema the models describe, on SQLite and on PostgreSQL."""

from __future__ import annotations

from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import inspect

from service.persistence.engine import make_engine
from service.persistence.migrate import upgrade
from service.persistence.models import Base


@pytest.fixture(params=["sqlite", "postgresql"])
def empty_database(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'fresh.db'}"
    url: str = request.getfixturevalue("postgres_url")
    return url


def test_upgrade_from_empty_matches_the_models(empty_database: str) -> None:
    upgrade(empty_database)
    engine = make_engine(empty_database)
    try:
        with engine.connect() as conn:
            tables = set(inspect(conn).get_table_names())
            assert set(Base.metadata.tables) <= tables
            context = MigrationContext.configure(conn, opts={"compare_type": True})
            diff = compare_metadata(context, Base.metadata)
        assert diff == [], f"models and migrations differ: {diff}"
        upgrade(empty_database)  # a second upgrade is a no-op
    finally:
        engine.dispose()
