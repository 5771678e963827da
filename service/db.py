"""Engines and sessions: SQLite (WAL, busy timeout) by default, PostgreSQL by URL."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session, sessionmaker

from service.bell import Bell, attach


def _sqlite_pragmas(dbapi_connection: Any, connection_record: Any) -> None:
    # WAL lets the API read while a worker report writes; the busy timeout makes writers
    # wait for each other instead of failing with "database is locked".
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA busy_timeout=30000")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.close()


def make_engine(url: str) -> Engine:
    """An engine for the URL, configured for concurrent API and worker use."""
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        if parsed.database and parsed.database != ":memory:":
            Path(parsed.database).parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 30})
        event.listen(engine, "connect", _sqlite_pragmas)
        return engine
    return create_engine(url, pool_pre_ping=True, pool_size=10, max_overflow=20)


def make_sessionmaker(
    engine: Engine, bells: tuple[Bell, Bell] | None = None
) -> sessionmaker[Session]:
    """Sessions that keep loaded objects usable after commit; with `bells` (queued, runs),
    ring them after commits that queued a run and that wrote one (see service.bell)."""
    maker = sessionmaker(engine, expire_on_commit=False)
    if bells is not None:
        attach(maker, *bells)
    return maker
