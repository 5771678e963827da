"""Engines and sessions: SQLite (WAL, busy timeout) by default, PostgreSQL by URL."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from sqlalchemy import URL, Engine, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import (
    AsyncEngine,
    AsyncSession,
    async_sessionmaker,
    create_async_engine,
)
from sqlalchemy.orm import Session, sessionmaker

from service.persistence.file_modes import private_dir, private_file, tighten_existing
from service.runs.wakeups import Bell, attach


def _sqlite_pragmas(dbapi_connection: Any, connection_record: Any) -> None:
    # WAL lets the API read while a worker report writes; the busy timeout makes writers
    # wait for each other instead of failing with "database is locked".
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA busy_timeout=30000")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.close()


def _private_sqlite_file(path: Path) -> None:
    # SQLite creates its -wal and -shm files with the mode of the database file, so an
    # owner-only database keeps its journal owner-only too.
    if not path.parent.exists():
        private_dir(path.parent)
    private_file(path)
    for journal in ("-wal", "-shm", "-journal"):
        tighten_existing(path.with_name(path.name + journal))


def make_engine(
    url: str, *, pool_size: int = 40, max_overflow: int = 10, pool_timeout: float = 10.0
) -> Engine:
    """An engine for the URL, configured for concurrent API and worker use.

    The pool holds at least as many connections as the thread pool has threads (40), so a
    request thread never waits for a connection held by a request waiting for a thread.
    """
    parsed = make_url(url)
    pool: dict[str, Any] = {
        "pool_size": pool_size,
        "max_overflow": max_overflow,
        "pool_timeout": pool_timeout,
    }
    if parsed.get_backend_name() == "sqlite":
        if parsed.database and parsed.database != ":memory:":
            _private_sqlite_file(Path(parsed.database))
            engine = create_engine(
                url, connect_args={"check_same_thread": False, "timeout": 30}, **pool
            )
        else:  # an in-memory database keeps the single-connection pool it needs
            engine = create_engine(url, connect_args={"check_same_thread": False})
        event.listen(engine, "connect", _sqlite_pragmas)
        return engine
    return create_engine(url, pool_pre_ping=True, **pool)


def _refuse_writes(session: Session, flush_context: Any, instances: Any) -> None:
    raise RuntimeError("a read session does not write: use the app's sessionmaker")


class ReadSession(Session):
    """A session for work that only reads: a flush with changes raises instead of writing."""


event.listen(ReadSession, "before_flush", _refuse_writes)


def make_read_sessionmaker(engine: Engine) -> sessionmaker[Session]:
    """Sessions for work that only reads (ReadSession).

    On PostgreSQL their connections run in autocommit. A read then needs no BEGIN and no
    ROLLBACK, and above all no ROLLBACK: psycopg forgets the statements it has prepared on a
    connection at every rollback, so reads that end in one are parsed and planned anew each
    time, however often they repeat. In autocommit a hot read's statements are prepared
    after a few uses and then only executed. Under PostgreSQL's READ COMMITTED each
    statement reads its own snapshot inside a transaction too, so what a read sees is the
    same. SQLite keeps its usual transactions (a read there takes one snapshot).
    """
    if engine.dialect.name == "postgresql":
        engine = engine.execution_options(isolation_level="AUTOCOMMIT")
    return sessionmaker(engine, class_=ReadSession, expire_on_commit=False)


def make_async_read_engine(url: URL, *, pool_size: int, pool_timeout: float) -> AsyncEngine:
    """An engine of psycopg's asyncio connections to the PostgreSQL database at `url`
    (whatever driver it names: psycopg is the one installed), for reads that wait for the
    database on the event loop: a pool of its own of `pool_size`, no overflow.

    No ping at checkout (a round trip: 8% of a read's CPU time under load): a connection the
    server has closed fails the read's first statement instead, SQLAlchemy then discards
    every connection opened before, and the read is run again (service.api.reads).

    Its connections are in autocommit from the start, for the reasons make_read_sessionmaker
    gives; set on the engine rather than per session, autocommit is not switched on at every
    checkout and off at every return (0.07-0.14 ms of a read's CPU time)."""
    return create_async_engine(
        url.set(drivername="postgresql+psycopg"),
        pool_size=pool_size,
        max_overflow=0,
        pool_timeout=pool_timeout,
        isolation_level="AUTOCOMMIT",
        json_deserializer=_json_loads,
    )


def _json_loads(data: bytes) -> Any:
    # A JSON column holds `null` for a Python None (SQLAlchemy's default for JSON): most
    # runs' progress and error, on every page. Answered without the parser, which for bytes
    # first works out their encoding: 50 such values took a page 0.07 ms.
    return None if data == b"null" else json.loads(data)


def make_async_read_sessionmaker(engine: AsyncEngine) -> async_sessionmaker[AsyncSession]:
    """Asyncio sessions for work that only reads (their sync sessions are ReadSessions), of
    an engine from make_async_read_engine."""
    return async_sessionmaker(engine, sync_session_class=ReadSession, expire_on_commit=False)


def make_sessionmaker(
    engine: Engine, bells: tuple[Bell, Bell] | None = None
) -> sessionmaker[Session]:
    """Sessions that keep loaded objects usable after commit; with `bells` (queued, runs),
    ring them after commits that queued a run and that wrote one (see service.runs.wakeups)."""
    maker = sessionmaker(engine, expire_on_commit=False)
    if bells is not None:
        attach(maker, *bells)
    return maker
