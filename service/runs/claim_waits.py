"""Claims that wait on the server (long polls) share one look at the queue.

A waiting claim holds no thread and no database connection: it waits for the queue's
generation to move. One watcher per process (a task that runs while any claim waits)
bumps the generation when the queued bell rings and, every `recheck_seconds`, when a cheap
read of the queue (how many runs are queued, the newest, whether a lease expired) differs
from the last one, which covers other API processes and expired leases. Claim attempts run
at most `concurrent_attempts` at a time, and after one finds the queue empty, the others
woken by the same change do not try: a hundred idle workers cost one read a second.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, TypeVar

from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker
from starlette.concurrency import run_in_threadpool

from service.errors import ServiceUnavailable
from service.persistence.models import Run, utcnow
from service.runs.wakeups import Bell

T = TypeVar("T")
_log = logging.getLogger(__name__)
_RETRY_AFTER_SECONDS = 5


class ClaimWaits:
    """The waiting claims of one app and the watcher that wakes them."""

    def __init__(
        self,
        *,
        sessionmaker: sessionmaker[Session],
        bell: Bell,
        max_waiting: int,
        recheck_seconds: float,
        max_waiting_per_token: int | None = None,
        concurrent_attempts: int = 4,
    ) -> None:
        self._sessionmaker, self._bell = sessionmaker, bell
        self.max_waiting, self.recheck_seconds = max_waiting, recheck_seconds
        self.max_waiting_per_token = max_waiting_per_token or max_waiting
        self.waiting = 0
        self._by_token: dict[int, int] = {}
        self.generation = 0
        self._moved = asyncio.Event()
        self._attempts = asyncio.Semaphore(concurrent_attempts)
        self._empty_at: int | None = None  # a generation at which an attempt found no run
        self._task: asyncio.Task[None] | None = None
        self._woken: asyncio.Event | None = None  # the watcher's registration on the bell

    @property
    def closed(self) -> bool:
        """The server is stopping: waiting claims answer now."""
        return self._bell.closed

    @contextlib.contextmanager
    def waiter(self, token_id: int = 0) -> Iterator[None]:
        """Count one waiting claim of `token_id`; ServiceUnavailable (503) past the bound of
        the server or of the token."""
        if self.waiting >= self.max_waiting:
            raise ServiceUnavailable(
                f"{self.waiting} claims are waiting, the most this server keeps "
                "(REPRO_MAX_WAITING_CLAIMS); retry later",
                retry_after=_RETRY_AFTER_SECONDS,
            )
        if self._by_token.get(token_id, 0) >= self.max_waiting_per_token:
            raise ServiceUnavailable(
                f"this token has {self._by_token[token_id]} claims waiting, the most one token "
                "may hold (REPRO_MAX_WAITING_CLAIMS_PER_TOKEN); retry later",
                retry_after=_RETRY_AFTER_SECONDS,
            )
        self.waiting += 1
        self._by_token[token_id] = self._by_token.get(token_id, 0) + 1
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._watch())
        try:
            yield
        finally:
            self.waiting -= 1
            if self._by_token[token_id] <= 1:
                del self._by_token[token_id]
            else:
                self._by_token[token_id] -= 1
            if not self.waiting and self._task is not None:
                self._task.cancel()
                self._task = None
                if self._woken is not None:  # now, not when the task next runs
                    self._bell.forget(self._woken)

    async def attempt(
        self, claim: Callable[[], T | None], *, generation: int, first: bool = False
    ) -> T | None:
        """`claim()` in a thread; a later (not `first`) attempt is skipped when an attempt at
        `generation` or since found no queued run at all."""
        if not first and self._empty_at is not None and self._empty_at >= generation:
            return None
        async with self._attempts:
            if not first and self._empty_at is not None and self._empty_at >= generation:
                return None
            got, empty = await run_in_threadpool(functools.partial(self._claim, claim))
        if got is None and empty and self.generation == generation:
            self._empty_at = generation  # nothing moved while it looked
        return got

    async def moved(
        self,
        generation: int,
        timeout: float,
        gone: Callable[[], Awaitable[object]] | None = None,
    ) -> None:
        """Return once the queue moved past `generation`, the server stops, `timeout` passes,
        or `gone()` (the client went away) returns."""
        if self.generation > generation or self.closed:
            return
        waits: list[asyncio.Future[object]] = [asyncio.ensure_future(self._moved.wait())]
        if gone is not None:
            waits.append(asyncio.ensure_future(gone()))
        try:
            await asyncio.wait(waits, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in waits:
                task.cancel()

    def _bump(self) -> None:
        self.generation += 1
        self._moved.set()
        self._moved = asyncio.Event()

    async def _watch(self) -> None:
        seen: Any = None
        rung = False
        while not self.closed:
            woken = self._woken = self._bell.listen()  # before reading, so no ring is missed
            try:
                try:
                    look = await run_in_threadpool(self._look)
                except Exception:  # the database is away: claims keep waiting, retry later
                    _log.exception("looking at the queue for waiting claims failed")
                    look = seen
                if rung or (look != seen and (look[0] or look[2])):
                    self._bump()
                seen, rung = look, False
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(woken.wait(), self.recheck_seconds)
                    rung = True
            finally:
                self._bell.forget(woken)
        self._bump()  # stopping: wake every waiter

    def _claim(self, claim: Callable[[], T | None]) -> tuple[T | None, bool]:
        got = claim()
        if got is not None:
            return got, False
        with self._sessionmaker() as db:
            queued = db.scalar(select(Run.id).where(Run.status == "queued").limit(1))
        return None, queued is None

    def _look(self) -> tuple[int, int | None, bool]:
        """How many runs are queued, the newest, and whether a running run's lease expired."""
        with self._sessionmaker() as db:
            count, newest = db.execute(
                select(func.count(Run.id), func.max(Run.id)).where(Run.status == "queued")
            ).one()
            expired = db.scalar(
                select(Run.id)
                .where(Run.status == "running", Run.lease_expires_at < utcnow())
                .limit(1)
            )
        return int(count), newest, expired is not None
