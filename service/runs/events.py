"""What the run event streams of one API process send, read once for all of them.

An open stream holds no thread and no database connection: it waits on its subscription.
One reader per process (a task that runs while any stream is open) reads the watched runs
when the runs bell rings (only the runs it names) and every `recheck_seconds` (all watched
runs, for writes made elsewhere), one query per read, and wakes the subscriptions of the
runs whose state changed. Five hundred streams on one run cost one read per change, not
five hundred.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterable
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker
from starlette.concurrency import run_in_threadpool

from service.errors import NotFound, ServiceUnavailable
from service.persistence.models import Run
from service.runs.wakeups import Bell

Snapshot = dict[str, Any]
_log = logging.getLogger(__name__)
_IDS_PER_QUERY = 500  # well under every database's bound on parameters
_RETRY_AFTER_SECONDS = 5


class Subscription:
    """One open stream: woken (`changed`) when its run's state changes or the server stops."""

    def __init__(self, run_id: int) -> None:
        self.run_id = run_id
        self.changed = asyncio.Event()
        self.ended = False


class RunWatcher:
    """The shared reader of the runs that open event streams follow (one per app)."""

    def __init__(
        self,
        *,
        sessionmaker: sessionmaker[Session],
        bell: Bell,
        max_streams: int,
        recheck_seconds: float,
    ) -> None:
        self._sessionmaker, self._bell = sessionmaker, bell
        self.max_streams, self.recheck_seconds = max_streams, recheck_seconds
        self._subs: dict[int, set[Subscription]] = {}
        self._latest: dict[int, Snapshot] = {}
        self._first_reads: dict[int, asyncio.Future[Snapshot | None]] = {}
        self._task: asyncio.Task[None] | None = None
        self._woken: asyncio.Event | None = None  # the watcher's registration on the bell
        self.open_streams = 0

    async def snapshot(self, run_id: int) -> Snapshot:
        """The run's state now (as last read, for a watched run); NotFound if absent."""
        if run_id in self._latest:
            return self._latest[run_id]
        pending = self._first_reads.get(run_id)
        if pending is None:  # concurrent openers of one run share one read
            pending = asyncio.ensure_future(self._read_one(run_id))
            self._first_reads[run_id] = pending
            pending.add_done_callback(lambda _: self._first_reads.pop(run_id, None))
        found = await asyncio.shield(pending)
        if found is None:
            raise NotFound(f"run {run_id} does not exist")
        return found

    def latest(self, run_id: int) -> Snapshot | None:
        """The last state read for a watched run."""
        return self._latest.get(run_id)

    def subscribe(self, run_id: int, seen: Snapshot) -> Subscription:
        """Follow a run whose state `seen` was sent; ServiceUnavailable (503) past the bound."""
        if self._bell.closed:
            raise ServiceUnavailable("the server is stopping", retry_after=_RETRY_AFTER_SECONDS)
        if self.open_streams >= self.max_streams:
            raise ServiceUnavailable(
                f"{self.open_streams} event streams are open, the most this server keeps "
                "(REPRO_MAX_EVENT_STREAMS); retry later or poll GET /api/v1/runs/{id}",
                retry_after=_RETRY_AFTER_SECONDS,
            )
        sub = Subscription(run_id)
        self._subs.setdefault(run_id, set()).add(sub)
        self._latest.setdefault(run_id, seen)
        self.open_streams += 1
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._watch())
        return sub

    def unsubscribe(self, sub: Subscription) -> None:
        """Stop following (idempotent); the reader stops with the last stream."""
        subs = self._subs.get(sub.run_id)
        if subs is None or sub not in subs:
            return
        subs.discard(sub)
        self.open_streams -= 1
        if not subs:
            del self._subs[sub.run_id]
            self._latest.pop(sub.run_id, None)
        if not self._subs and self._task is not None:
            self._task.cancel()
            self._task = None
            if self._woken is not None:  # now, not when the task next runs
                self._bell.forget(self._woken)

    async def _watch(self) -> None:
        everything = True  # the first read covers writes made before it listened
        try:
            while self._subs and not self._bell.closed:
                woken = self._woken = self._bell.listen()  # before reading, so no ring is missed
                try:
                    changed = self._bell.take_keys()
                    ids = list(self._subs)
                    if not everything and changed is not None:
                        ids = [run_id for run_id in changed if run_id in self._subs]
                    if ids:
                        await self._refresh(ids)
                    everything = True
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(woken.wait(), self.recheck_seconds)
                        everything = False
                finally:
                    self._bell.forget(woken)
        finally:
            if self._bell.closed:
                self._end_all()

    async def _refresh(self, ids: list[int]) -> None:
        try:
            found = await run_in_threadpool(self._read, ids)
        except Exception:  # the database is away: streams keep waiting, the next read retries
            _log.exception("reading the runs of open event streams failed")
            return
        for run_id, snap in found.items():
            subs = self._subs.get(run_id)
            if subs and self._latest.get(run_id) != snap:
                self._latest[run_id] = snap
                for sub in subs:
                    sub.changed.set()

    def _end_all(self) -> None:
        for subs in self._subs.values():
            for sub in subs:
                sub.ended = True
                sub.changed.set()

    async def _read_one(self, run_id: int) -> Snapshot | None:
        return (await run_in_threadpool(self._read, [run_id])).get(run_id)

    def _read(self, ids: Iterable[int]) -> dict[int, Snapshot]:
        wanted, found = sorted(set(ids)), {}
        with self._sessionmaker() as db:
            for start in range(0, len(wanted), _IDS_PER_QUERY):
                rows = db.execute(
                    select(
                        Run.id, Run.status, Run.attempt, Run.progress, Run.final_fingerprint
                    ).where(Run.id.in_(wanted[start : start + _IDS_PER_QUERY]))
                )
                for row in rows:
                    found[row.id] = {
                        "id": row.id,
                        "status": row.status,
                        "attempt": row.attempt,
                        "progress": row.progress,
                        "final_fingerprint": row.final_fingerprint,
                    }
        return found
