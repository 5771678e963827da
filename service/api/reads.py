"""Where the hot read routes do their database work: on the event loop.

A sync route runs in the thread pool: one hand-off there and back per request, and with
many requests in flight the pool's threads and the event loop take turns at the GIL. For
an embedded SQLite database that costs more than the read itself (GET /runs/{id} took
twice the CPU time in the pool as on the event loop, a page of runs more than twice),
and it buys nothing: the file is local, and in WAL mode a reader never waits for a
writer. So with SQLite these reads are called on the event loop; the price is that a long
one (a count or a deep offset over 100,000 runs: 3-15 ms) holds up every other request
for that long.

With PostgreSQL the same sync code runs on the event loop over psycopg's asyncio
connections (`run_sync` of an asyncio session, or of a bare connection for work that runs
only SELECTs of its own, such as a page of runs): each time it waits for the database,
the loop serves other requests, so a slow network or a long query holds up neither
another request nor a thread. Read in the thread pool, a run's detail cost the server a
third more CPU time (2.5 against 1.9 ms with 16 in flight), spent on the pool's threads
taking turns at the GIL (80 context switches a read; see benchmarks/README.md). These
connections are a pool of their own (`db_read_pool_size`) next to the app's engine, which
serves writes and the sync routes. Any other server database is read in the thread pool.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from fastapi import Request
from sqlalchemy import Connection, Engine
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker
from sqlalchemy.orm import Session, sessionmaker
from starlette.concurrency import run_in_threadpool

from service.persistence.engine import make_async_read_engine, make_async_read_sessionmaker

T = TypeVar("T")


class LoopReads:
    """Read-only sessions (or connections) for the hot reads, and where their work runs (see
    the module)."""

    def __init__(
        self,
        engine: Engine,
        sessions: sessionmaker[Session],
        *,
        pool_size: int,
        pool_timeout: float,
    ) -> None:
        """`sessions`: the app's read-only sessions of `engine`, which the reads use unless
        the database is PostgreSQL."""
        # The engine whose connections these reads use, for its events (on PostgreSQL the
        # asyncio engine's sync face).
        self.engine = engine
        self._sessions = sessions
        self._in_thread = engine.dialect.name not in ("sqlite", "postgresql")
        self._async_engine: AsyncEngine | None = None
        self._async_sessions: async_sessionmaker[AsyncSession] | None = None
        if engine.dialect.name == "postgresql":
            self._async_engine = make_async_read_engine(
                engine.url, pool_size=pool_size, pool_timeout=pool_timeout
            )
            self._async_sessions = make_async_read_sessionmaker(self._async_engine)
            self.engine = self._async_engine.sync_engine

    def _in_session(self, work: Callable[[Session], T]) -> T:
        with self._sessions() as db:
            return work(db)

    def _in_connection(self, work: Callable[[Connection], T]) -> T:
        with self.engine.connect() as connection:
            return work(connection)

    async def run(self, work: Callable[[Session], T]) -> T:
        """`work(session)`'s result, with a read-only session of its own."""
        if self._async_sessions is not None:
            return await self._again_if_closed(self._run_async, work)
        if self._in_thread:
            return await run_in_threadpool(self._in_session, work)
        return self._in_session(work)

    async def run_core(self, work: Callable[[Connection], T]) -> T:
        """`work(connection)`'s result, for work that only runs SELECT statements of its
        own (Core, no ORM): on a connection of the same pool, without a session. Creating
        an AsyncSession and its transaction cost a PostgreSQL page of runs 0.2 ms of CPU,
        a fifth of it timed in one process."""
        if self._async_engine is not None:
            return await self._again_if_closed(self._run_core_async, work)
        if self._in_thread:
            return await run_in_threadpool(self._in_connection, work)
        return self._in_connection(work)

    async def _again_if_closed(
        self, run: Callable[[Callable[[Any], T]], Awaitable[T]], work: Callable[[Any], T]
    ) -> T:
        try:
            return await run(work)
        except DBAPIError as error:
            # The connection had been closed by the server (a restart, an idle timeout): the
            # pool has discarded it and every other as old, and a read can run again.
            if not error.connection_invalidated:
                raise
        return await run(work)

    async def _run_async(self, work: Callable[[Session], T]) -> T:
        assert self._async_sessions is not None
        async with self._async_sessions() as db:
            return await db.run_sync(work)

    async def _run_core_async(self, work: Callable[[Connection], T]) -> T:
        assert self._async_engine is not None
        async with self._async_engine.connect() as connection:
            return await connection.run_sync(work)

    async def dispose(self) -> None:
        """Close the pooled asyncio connections (the other sessions use the app's engine)."""
        if self._async_engine is not None:
            await self._async_engine.dispose()


async def read(request: Request, work: Callable[[Session], T]) -> T:
    """`work(session)`'s result, with a read-only session, run as the module says."""
    loop_reads: LoopReads = request.app.state.loop_reads
    return await loop_reads.run(work)


async def read_core(request: Request, work: Callable[[Connection], T]) -> T:
    """`work(connection)`'s result, for SELECTs only (`LoopReads.run_core`)."""
    loop_reads: LoopReads = request.app.state.loop_reads
    return await loop_reads.run_core(work)
