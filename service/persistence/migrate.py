"""Running the Alembic migrations in `migrations/` programmatically, one migrator at a time."""

from __future__ import annotations

import contextlib
import fcntl
import logging
from collections.abc import Iterator
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import create_engine, text
from sqlalchemy.engine import Connection, make_url
from sqlalchemy.exc import OperationalError

import migrations
from service.config import get_settings
from service.persistence.engine import make_engine
from service.persistence.file_modes import private_dir, private_file

MIGRATIONS_DIR = Path(migrations.__file__).resolve().parent

# The key of the PostgreSQL advisory lock every migrator of a database takes: any fixed
# 64-bit number works as long as nothing else in the database uses it ("reprotrn" in ASCII).
MIGRATION_LOCK_KEY = 0x72657072_6F74726E
_LOCK_NOT_AVAILABLE = "55P03"  # PostgreSQL's SQLSTATE for a lock_timeout that expired

log = logging.getLogger(__name__)


class MigrationLockTimeout(RuntimeError):
    """Another migrator held this database's migration lock longer than this one would wait."""


def alembic_config(database_url: str) -> Config:
    """An Alembic config for the database (no alembic.ini needed)."""
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    config.set_main_option("sqlalchemy.url", database_url.replace("%", "%%"))
    return config


@contextlib.contextmanager
def _postgres_lock(database_url: str, timeout: float) -> Iterator[None]:
    # Alembic has no lock of its own: two migrators of a fresh database both create
    # alembic_version and the second fails. A session-level advisory lock, held on a
    # connection of its own while Alembic migrates on another, makes every other migrator
    # wait; the server releases it if this process dies, so a crash never leaves it held.
    # The wait is bounded by the session's lock_timeout, which applies to advisory locks too.
    engine = create_engine(database_url, isolation_level="AUTOCOMMIT")
    try:
        with engine.connect() as conn:
            got = conn.scalar(text("SELECT pg_try_advisory_lock(:k)"), {"k": MIGRATION_LOCK_KEY})
            if not got:
                log.info(
                    "another process is migrating this database: waiting up to %g s for it",
                    timeout,
                )
                _wait_for_lock(conn, timeout)
            try:
                yield
            finally:
                conn.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": MIGRATION_LOCK_KEY})
    finally:
        engine.dispose()


def _wait_for_lock(conn: Connection, timeout: float) -> None:
    milliseconds = max(1, round(timeout * 1000))
    conn.execute(text("SELECT set_config('lock_timeout', :t, false)"), {"t": f"{milliseconds}ms"})
    try:
        conn.execute(text("SELECT pg_advisory_lock(:k)"), {"k": MIGRATION_LOCK_KEY})
    except OperationalError as exc:
        if getattr(exc.orig, "sqlstate", None) != _LOCK_NOT_AVAILABLE:
            raise
        raise MigrationLockTimeout(
            f"gave up after waiting {timeout:g} s (REPRO_MIGRATION_LOCK_TIMEOUT_SECONDS) for the "
            "migration lock of this database: another migrator holds it (a `repro db upgrade` or "
            "a server migrating on start, still running or stuck); let it finish, or end its "
            "session (pg_locks: locktype 'advisory'), then migrate again"
        ) from None
    finally:
        conn.execute(text("RESET lock_timeout"))


@contextlib.contextmanager
def _file_lock(database: Path) -> Iterator[None]:
    # SQLite's own write lock does not serialise migrators: Python's sqlite3 driver starts no
    # transaction before DDL, so each statement commits on its own and two migrators both see
    # an empty database. A lock file beside the database does (every migrator of a SQLite
    # file runs on this machine).
    lock_path = database.with_name(database.name + ".migrate-lock")
    if not lock_path.parent.exists():
        private_dir(lock_path.parent)
    with open(private_file(lock_path), "rb") as lock:
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock.fileno(), fcntl.LOCK_UN)


def migration_lock(
    database_url: str, *, timeout: float | None = None
) -> contextlib.AbstractContextManager[None]:
    """Held while migrating: other migrators of the same database wait until it is released.

    On PostgreSQL a migrator waits at most `timeout` seconds (None: the settings'
    `migration_lock_timeout_seconds`) and then raises MigrationLockTimeout; a SQLite file's
    migrators wait without a bound."""
    url = make_url(database_url)
    if url.get_backend_name() == "postgresql":
        if timeout is None:
            timeout = get_settings().migration_lock_timeout_seconds
        return _postgres_lock(database_url, timeout)
    if url.get_backend_name() == "sqlite" and url.database and url.database != ":memory:":
        return _file_lock(Path(url.database))
    return contextlib.nullcontext()


def upgrade(
    database_url: str, revision: str = "head", *, lock_timeout: float | None = None
) -> None:
    """Bring the database schema up to `revision` (creating the SQLite file if needed), one
    migrator of the database at a time (see `migration_lock` for how long one waits)."""
    with migration_lock(database_url, timeout=lock_timeout):
        command.upgrade(alembic_config(database_url), revision)


def schema_behind(database_url: str) -> str | None:
    """Why the database is not at the migrations' head (None when it is), without changing it."""
    heads = set(ScriptDirectory.from_config(alembic_config(database_url)).get_heads())
    engine = make_engine(database_url)
    try:
        with engine.connect() as conn:
            current = set(MigrationContext.configure(conn).get_current_heads())
    finally:
        engine.dispose()
    if current == heads:
        return None
    have = ", ".join(sorted(current)) or "no schema"
    return f"the database is at {have}, this version needs {', '.join(sorted(heads))}"
