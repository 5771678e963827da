"""`GET /runs`: filtered pages of runs, newest first, cut by keyset cursors.

A page ends at a run id; the next page asks for runs with a smaller id (an indexed key:
`(kind, id)`, or `(kind, status, id)` with a status filter), so the page after 90,000 runs
costs what the first one does. No count is made unless asked for: counting reads every
matching row. Runs inserted while a client pages have larger ids than its cursor, so they
never push a run into the next page twice, and every run that existed when paging began
is seen exactly once. `offset` still works (it skips rows, at a cost that grows with it).
"""

from __future__ import annotations

import base64
import binascii
import re
from dataclasses import dataclass
from functools import cache
from typing import Any

from sqlalchemy import DateTime, Select, String, bindparam, exists, func, select, type_coerce
from sqlalchemy.orm import Session, aliased

from service.api.views import out_columns
from service.models import Run, Verdict
from service.schemas import MAX_ID, RunPage
from service.verdicts import is_reference

_CURSOR = re.compile(r"^before:([1-9]\d{0,9})$")
MAX_CURSOR_CHARS = 40


def encode_cursor(before_id: int) -> str:
    """The opaque cursor of the page of runs older than `before_id`."""
    return base64.urlsafe_b64encode(f"before:{before_id}".encode()).decode().rstrip("=")


def decode_cursor(cursor: str) -> int:
    """The run id a cursor pages before; ValueError for anything this server did not issue."""
    if not 0 < len(cursor) <= MAX_CURSOR_CHARS:
        raise ValueError("not a cursor this server issued")
    try:
        text = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode("ascii")
    except (binascii.Error, UnicodeDecodeError, ValueError):
        raise ValueError("not a cursor this server issued") from None
    match = _CURSOR.match(text)
    if match is None or int(match.group(1)) > MAX_ID:
        raise ValueError("not a cursor this server issued")
    return int(match.group(1))


def checked_cursor(cursor: str | None) -> str | None:
    """The cursor unchanged if it decodes (for validating the query parameter)."""
    if cursor is not None:
        decode_cursor(cursor)
    return cursor


@dataclass(frozen=True)
class RunFilters:
    kind: str = "train"
    status: str | None = None
    experiment_id: int | None = None
    verdict: str | None = None  # identical, diverged, incomparable, reference or none


def _filtered(query: Select[Any], filters: RunFilters, *, verdicts: bool) -> Select[Any]:
    """`query` narrowed to `filters`; with `verdicts`, also selecting each run's verdict."""
    query = query.where(Run.kind == filters.kind)
    if filters.status is not None:
        query = query.where(Run.status == filters.status)
    if filters.experiment_id is not None:
        query = query.where(Run.experiment_id == filters.experiment_id)
    verdict = filters.verdict
    if verdict in ("identical", "diverged", "incomparable"):
        query = query.join(Verdict, Verdict.run_id == Run.id).where(Verdict.verdict == verdict)
        return query.add_columns(Verdict.verdict) if verdicts else query
    if verdicts or verdict == "none":
        # One verdict per run at most (unique run_id): the join repeats no run.
        query = query.outerjoin(Verdict, Verdict.run_id == Run.id)
    if verdicts:
        query = query.add_columns(Verdict.verdict)
    if verdict == "none":
        query = query.where(Verdict.id.is_(None))
    elif verdict == "reference":
        # The first successful training of its family; asked per row, so a page stops
        # reading once it is full instead of grouping every family first.
        earlier = aliased(Run)
        query = query.where(
            Run.status == "succeeded",
            Run.kind == "train",
            ~exists().where(
                earlier.family_id == Run.family_id,
                earlier.status == "succeeded",
                earlier.kind == "train",
                earlier.id < Run.id,
            ),
        )
    return query


@cache
def _page_query(
    status: bool, experiment: bool, verdict: str | None, after_cursor: bool, text_times: bool
) -> Select[Any]:
    """The statement of a page for this shape of filters, built once (building one costs
    more than running it): the filter values, the cursor's id, offset and limit are bound
    when it runs. With `text_times` (SQLite, which stores datetimes as ISO text) the
    datetime columns come back as that text: the page's validation parses it, where the
    driver's conversion to datetime objects took a regex match per value."""
    shape = RunFilters(
        kind=bindparam("kind"),  # type: ignore[arg-type]
        status=bindparam("status") if status else None,  # type: ignore[arg-type]
        experiment_id=bindparam("experiment_id") if experiment else None,  # type: ignore[arg-type]
        verdict=verdict,
    )
    columns = out_columns()
    if text_times:
        columns = tuple(
            type_coerce(c, String).label(c.key) if isinstance(c.type, DateTime) else c
            for c in columns
        )
    # The reference marks come with the rows (a subquery for a rerun that succeeded): a
    # second statement for them cost a PostgreSQL page about a fifth of its time.
    query = _filtered(
        select(*columns, is_reference(Run).label("is_reference")), shape, verdicts=True
    )
    if after_cursor:
        query = query.where(Run.id < bindparam("before"))
    return query.order_by(Run.id.desc()).offset(bindparam("offset")).limit(bindparam("limit"))


def list_runs(
    *,
    db: Session,
    filters: RunFilters,
    limit: int,
    cursor: str | None = None,
    offset: int = 0,
    count: bool = False,
) -> RunPage:
    """A page of runs matching `filters`, newest first, after `cursor` (and `offset`)."""
    query = _page_query(
        filters.status is not None,
        filters.experiment_id is not None,
        filters.verdict,
        cursor is not None,
        db.get_bind().dialect.name == "sqlite",
    )
    values: dict[str, Any] = {"kind": filters.kind, "offset": offset, "limit": limit + 1}
    if filters.status is not None:
        values["status"] = filters.status
    if filters.experiment_id is not None:
        values["experiment_id"] = filters.experiment_id
    if cursor is not None:
        values["before"] = decode_cursor(cursor)
    # Core rows, not ORM entities: a list shows columns only.
    result = db.connection().execute(query, values)
    keys = tuple(result.keys())
    rows = [dict(zip(keys, row, strict=True)) for row in result.all()]
    more = len(rows) > limit
    rows = rows[:limit]
    total = None
    if count:
        matching = _filtered(select(Run.id), filters, verdicts=False).subquery()
        total = db.scalar(select(func.count()).select_from(matching))
    # Validated as one document: one call into pydantic, not one per run.
    return RunPage.model_validate(
        {
            "items": rows,
            "next_cursor": encode_cursor(rows[-1]["id"]) if more else None,
            "total": total,
            "limit": limit,
            "offset": offset,
        }
    )
