"""Where the hot read routes do their database work.

A sync route runs in the thread pool: one hand-off there and back per request, and with
many requests in flight the pool's threads and the event loop take turns at the GIL. For
an embedded SQLite database that costs more than the read itself (GET /runs/{id} took
twice the CPU time in the pool as on the event loop, a page of runs more than twice),
and it buys nothing: the file is local, and in WAL mode a reader never waits for a
writer. So with SQLite these reads run on the event loop; the price is that a long one
(a count or a deep offset over 100,000 runs: 3-15 ms) holds up every other request for
that long. A server database is read from the pool, where a slow network or a long query
holds up one thread instead of every request.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from fastapi import Request
from starlette.concurrency import run_in_threadpool

T = TypeVar("T")


async def read(request: Request, work: Callable[[], T]) -> T:
    """`work()`'s result: called right here with SQLite, else in the thread pool."""
    if request.app.state.engine.dialect.name == "sqlite":
        return work()
    return await run_in_threadpool(work)
