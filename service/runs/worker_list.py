"""Registered workers a page at a time, most recently seen first, cut by keyset cursors.

A page ends at a worker's (last seen, id); the next page asks for workers seen before it
(or at the same instant with a smaller id), so a page costs the same wherever it starts.
A worker seen again while a client pages moves to the front, ahead of the cursor: a client
that must not miss one reads the list again from the first page.
"""

from __future__ import annotations

import base64
import binascii
import re
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import and_, or_, select
from sqlalchemy.orm import Session

from service.persistence.models import Worker
from service.schemas import MAX_ID

MAX_CURSOR_CHARS = 80
_CURSOR = re.compile(r"^seen:(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d{1,6})?),([1-9]\d{0,18})$")
_NOT_OURS = "not a cursor this server issued"


@dataclass(frozen=True)
class WorkerPage:
    """One page of workers and the cursor of the next (None: this was the last)."""

    workers: list[Worker]
    next_cursor: str | None


def encode_cursor(worker: Worker) -> str:
    """The opaque cursor of the page of workers seen before `worker`."""
    text = f"seen:{worker.last_seen_at.isoformat()},{worker.id}"
    return base64.urlsafe_b64encode(text.encode()).decode().rstrip("=")


def decode_cursor(cursor: str) -> tuple[datetime, int]:
    """(last seen, id) a cursor pages after; ValueError for anything this server did not issue."""
    if not 0 < len(cursor) <= MAX_CURSOR_CHARS:
        raise ValueError(_NOT_OURS)
    try:
        text = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode("ascii")
        match = _CURSOR.match(text)
        if match is None or int(match.group(2)) > MAX_ID:
            raise ValueError(_NOT_OURS)
        return datetime.fromisoformat(match.group(1)), int(match.group(2))
    except (binascii.Error, UnicodeDecodeError, ValueError):
        raise ValueError(_NOT_OURS) from None


def checked_cursor(cursor: str | None) -> str | None:
    """The cursor unchanged if it decodes (for validating a query parameter)."""
    if cursor is not None:
        decode_cursor(cursor)
    return cursor


def workers_page(db: Session, *, limit: int, cursor: str | None = None) -> WorkerPage:
    """At most `limit` workers, most recently seen first, after `cursor`."""
    query = select(Worker).order_by(Worker.last_seen_at.desc(), Worker.id.desc())
    if cursor is not None:
        seen, worker_id = decode_cursor(cursor)
        query = query.where(
            or_(
                Worker.last_seen_at < seen,
                and_(Worker.last_seen_at == seen, Worker.id < worker_id),
            )
        )
    rows = list(db.scalars(query.limit(limit + 1)))
    more = len(rows) > limit
    rows = rows[:limit]
    return WorkerPage(rows, encode_cursor(rows[-1]) if more else None)
