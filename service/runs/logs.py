"""A job's log on the server: the pieces its worker sends with heartbeats, kept per attempt
up to `max_log_bytes` (the oldest go first), read back from an offset so a follower gets
only what is new."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import delete, func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from service.persistence.models import RunLogChunk

PIECE_CHARS = 64 * 1024  # the most a heartbeat carries


def append(
    db: Session, *, run_id: int, attempt: int, offset: int, text: str, max_bytes: int
) -> None:
    """Add the piece starting at `offset` of the attempt's log; a piece the server has
    (a repeated heartbeat) adds nothing. The caller commits."""
    held = (RunLogChunk.run_id == run_id, RunLogChunk.attempt == attempt)
    end = db.scalar(select(func.max(RunLogChunk.offset + RunLogChunk.size)).where(*held)) or 0
    if offset < end or not text:
        return
    try:
        with db.begin_nested():  # the same piece from a concurrent retry: one of them stays
            db.add(
                RunLogChunk(
                    run_id=run_id,
                    attempt=attempt,
                    offset=offset,
                    text=text,
                    size=len(text.encode("utf-8")),
                )
            )
    except IntegrityError:
        return
    kept, newest_first = (
        0,
        db.execute(
            select(RunLogChunk.offset, RunLogChunk.size)
            .where(*held)
            .order_by(RunLogChunk.offset.desc())
        ).all(),
    )
    for i, (start, size) in enumerate(newest_first):
        kept += size
        if kept > max_bytes and i > 0:  # the newest piece always stays
            db.execute(delete(RunLogChunk).where(*held, RunLogChunk.offset <= start))
            return


@dataclass(frozen=True)
class LogView:
    attempt: int | None  # None: no log was sent for this run
    attempts: list[int]
    start: int  # where the text starts in the attempt's log
    end: int  # where the next piece will start: the `after` of the next read
    text: str
    dropped: int  # bytes between the offset asked for and `start` no longer kept


def read(db: Session, run_id: int, *, attempt: int | None = None, after: int = 0) -> LogView:
    """The kept log of an attempt (the latest by default) from offset `after`."""
    attempts = list(
        db.scalars(
            select(RunLogChunk.attempt)
            .where(RunLogChunk.run_id == run_id)
            .distinct()
            .order_by(RunLogChunk.attempt)
        )
    )
    chosen = attempt if attempt is not None else (attempts[-1] if attempts else None)
    if chosen is None or chosen not in attempts:
        return LogView(chosen, attempts, after, after, "", 0)
    pieces = db.execute(
        select(RunLogChunk.offset, RunLogChunk.size, RunLogChunk.text)
        .where(
            RunLogChunk.run_id == run_id,
            RunLogChunk.attempt == chosen,
            RunLogChunk.offset + RunLogChunk.size > after,
        )
        .order_by(RunLogChunk.offset)
    ).all()
    if not pieces:
        return LogView(chosen, attempts, after, after, "", 0)
    first, last = pieces[0], pieces[-1]
    text, start = "".join(p.text for p in pieces), first.offset
    if start < after:  # `after` inside the first piece: only what follows it
        text = text.encode("utf-8")[after - start :].decode("utf-8", errors="replace")
        start = after
    return LogView(chosen, attempts, start, last.offset + last.size, text, start - after)
