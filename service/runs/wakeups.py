"""Bells that wake requests waiting on the server as soon as what they wait for may be there.

Sessions of the service's sessionmaker note a flush that wrote a run, and one that left a
run queued (a submission, a rerun, a refinement, a release), and ring the matching bell
once that transaction commits: waiting claims (long polls) and run event streams in this
process wake at once. The runs bell also says which runs were written, so the streams'
shared reader reads only those. Both also look again on their own every second or so,
which covers changes made by another API process, bulk updates and leases that expire.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Iterable
from typing import Any

from sqlalchemy import event
from sqlalchemy.orm import Session, sessionmaker

_NOTED = "reprotrain.run_queued"
_WRITTEN = "reprotrain.run_written"
# Keys remembered between two reads of them; past this many, "everything may have changed".
_MAX_KEYS = 10_000


class _Stopping:
    """Whether the server is stopping: one fact shared by all the bells of one app."""

    def __init__(self) -> None:
        self.stopped = False
        self.bells: list[Bell] = []


class Bell:
    """Thread-safe: `ring()` from any thread wakes every `wait()` pending in any event loop."""

    def __init__(self, stopping: _Stopping | None = None) -> None:
        self._lock = threading.Lock()
        self._waiters: set[tuple[asyncio.AbstractEventLoop, asyncio.Event]] = set()
        self._keys: set[int] | None = set()
        self._stopping = stopping or _Stopping()
        self._stopping.bells.append(self)

    @property
    def closed(self) -> bool:
        """Whether the server is stopping (any bell of this app was closed)."""
        return self._stopping.stopped

    def close(self) -> None:
        """The server is stopping: wake every waiter of this app's bells, and have waits end."""
        self._stopping.stopped = True
        for bell in self._stopping.bells:
            bell.ring()

    def ring(self, keys: Iterable[int] = ()) -> None:
        """Wake every waiter now; `keys` (e.g. run ids) say what changed."""
        with self._lock:
            if self._keys is not None:
                self._keys.update(keys)
                if len(self._keys) > _MAX_KEYS:
                    self._keys = None
            waiters = list(self._waiters)
        for loop, woken in waiters:
            with contextlib.suppress(RuntimeError):  # a closed loop: its waiter went with it
                loop.call_soon_threadsafe(woken.set)

    def listen(self) -> asyncio.Event:
        """An event set by the next ring; register before looking, so no ring is missed."""
        woken = asyncio.Event()
        with self._lock:
            self._waiters.add((asyncio.get_running_loop(), woken))
        return woken

    def forget(self, woken: asyncio.Event) -> None:
        """Stop listening with an event from `listen()`."""
        with self._lock:
            self._waiters = {w for w in self._waiters if w[1] is not woken}

    def take_keys(self) -> set[int] | None:
        """The keys rung since the last call (None: too many to remember, assume all)."""
        with self._lock:
            keys, self._keys = self._keys, set()
        return keys

    @property
    def listeners(self) -> int:
        """How many waits are registered now."""
        with self._lock:
            return len(self._waiters)


def app_bells() -> tuple[Bell, Bell]:
    """The (queued, runs) bells of one app: closing either means the server is stopping."""
    stopping = _Stopping()
    return Bell(stopping), Bell(stopping)


def note_queued(session: Session) -> None:
    """Ring after this session's commit: for bulk updates, which flush events do not see."""
    session.info[_NOTED] = True


def note_written(session: Session, run_id: int) -> None:
    """Ring the runs bell for `run_id` after this session's commit (a bulk update)."""
    session.info.setdefault(_WRITTEN, set()).add(run_id)


def attach(maker: sessionmaker[Session], queued: Bell, runs: Bell) -> None:
    """Ring `queued` after each commit of `maker`'s sessions that left a run queued, and
    `runs` after each that wrote a run."""
    from service.persistence.models import Run

    def after_flush(session: Session, flush_context: Any) -> None:
        # Before the flush's bookkeeping: new and dirty still hold what was just written.
        written = [obj for obj in (*session.new, *session.dirty) if isinstance(obj, Run)]
        if written:
            session.info.setdefault(_WRITTEN, set()).update(run.id for run in written)
        if any(run.status == "queued" for run in written):
            note_queued(session)

    def after_commit(session: Session) -> None:
        if session.info.pop(_NOTED, False):
            queued.ring()
        written = session.info.pop(_WRITTEN, None)
        if written:
            runs.ring(written)

    def after_rollback(session: Session) -> None:
        session.info.pop(_NOTED, None)
        session.info.pop(_WRITTEN, None)

    event.listen(maker, "after_flush", after_flush)
    event.listen(maker, "after_commit", after_commit)
    event.listen(maker, "after_rollback", after_rollback)
