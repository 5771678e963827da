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


def test_existing_experiments_get_their_parameters_when_search_arrives(
    empty_database: str,
) -> None:
    """0017 fills `experiment_params` from the specs of experiments already stored."""
    import json

    from sqlalchemy import text

    from tests.integration.dashboard_world import spec_doc

    upgrade(empty_database, "0016")
    engine = make_engine(empty_database)
    try:
        with engine.begin() as conn:
            conn.execute(
                text(
                    "INSERT INTO experiments (id, name, spec, spec_hash, submitted_spec_hash, "
                    "seed, seed_source, created_at) VALUES (7, 'old', :spec, 'sha256:a', "
                    "'sha256:a', '[42, 0]', 'spec', CURRENT_TIMESTAMP)"
                ),
                {"spec": json.dumps({**spec_doc(), "seed": [42, 0]})},
            )
        upgrade(empty_database)
        with engine.connect() as conn:
            rows = dict(
                conn.execute(
                    text(
                        "SELECT name, COALESCE(CAST(num AS TEXT), text) FROM experiment_params "
                        "WHERE experiment_id = 7"
                    )
                ).all()
            )
    finally:
        engine.dispose()
    assert float(rows["training.optimizer.params.learning_rate"]) == 0.001
    assert rows["training.optimizer.name"] == "adam" and rows["seed"] == "[42,0]"
    assert rows["model.params.hidden"] == "[8]"
