"""Several servers (or a migration job and the API) starting at once on one fresh database:
every migration succeeds and the schema is the models'."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import inspect, text

from service.config import get_settings
from service.persistence.engine import make_engine
from service.persistence.models import Base

STARTERS = 4

# Each process imports everything first, then waits for the go file, so the migrations
# begin within a few milliseconds of each other rather than a process start apart.
_STARTER = """
import sys, time
from pathlib import Path
from service.persistence.migrate import upgrade
go = Path(sys.argv[2])
while not go.exists():
    time.sleep(0.002)
upgrade(sys.argv[1])
print("migrated")
"""


@pytest.fixture(params=["sqlite", "postgresql"])
def fresh_database(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'data' / 'fresh.db'}"
    url: str = request.getfixturevalue("postgres_url")
    return url


def _start_together(database_url: str, go: Path, count: int) -> list[subprocess.Popen[str]]:
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _STARTER, database_url, str(go)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(count)
    ]
    time.sleep(4)  # every process imported and waiting (a late one only races less)
    go.touch()
    return procs


def test_concurrent_migrations_all_succeed_with_the_models_schema(
    fresh_database: str, tmp_path: Path
) -> None:
    procs = _start_together(fresh_database, tmp_path / "go", STARTERS)
    outcomes = [(p.wait(timeout=180), *p.communicate()) for p in procs]
    for code, out, err in outcomes:
        assert code == 0 and out.strip() == "migrated", err[-3000:]

    engine = make_engine(fresh_database)
    try:
        with engine.connect() as conn:
            assert set(Base.metadata.tables) <= set(inspect(conn).get_table_names())
            context = MigrationContext.configure(conn, opts={"compare_type": True})
            assert compare_metadata(context, Base.metadata) == []
            versions = conn.execute(text("SELECT version_num FROM alembic_version")).all()
            assert len(versions) == 1  # one head, recorded once
    finally:
        engine.dispose()


@pytest.fixture
def lock_timeout(monkeypatch: pytest.MonkeyPatch) -> Iterator[float]:
    """REPRO_MIGRATION_LOCK_TIMEOUT_SECONDS, set as an operator sets it, read afresh."""
    monkeypatch.setenv("REPRO_MIGRATION_LOCK_TIMEOUT_SECONDS", "1.5")
    get_settings.cache_clear()
    yield 1.5
    get_settings.cache_clear()


def test_a_migrator_waits_a_bounded_time_for_another_ones_lock(
    postgres_url: str, lock_timeout: float
) -> None:
    from sqlalchemy import create_engine

    from service.persistence.migrate import MIGRATION_LOCK_KEY, MigrationLockTimeout, upgrade

    holder = create_engine(postgres_url, isolation_level="AUTOCOMMIT")
    try:
        with holder.connect() as conn:  # another migrator, stuck mid-migration
            conn.execute(text("SELECT pg_advisory_lock(:k)"), {"k": MIGRATION_LOCK_KEY})
            started = time.monotonic()
            with pytest.raises(
                MigrationLockTimeout, match=r"1\.5 s \(REPRO_MIGRATION_LOCK_TIMEOUT_SECONDS\)"
            ):
                upgrade(postgres_url)
            waited = time.monotonic() - started
            conn.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": MIGRATION_LOCK_KEY})
        assert lock_timeout - 0.1 < waited < 30, waited
        upgrade(postgres_url)  # released: it migrates
    finally:
        holder.dispose()
