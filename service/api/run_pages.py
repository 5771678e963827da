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

from pydantic_core import CoreSchema, SchemaSerializer, core_schema
from sqlalchemy import (
    ColumnElement,
    Connection,
    DateTime,
    Select,
    bindparam,
    exists,
    func,
    select,
)
from sqlalchemy.orm import aliased

from service.api.views import out_columns
from service.persistence.archived import narrowed
from service.persistence.models import Run, RunTag, Verdict
from service.persistence.sql_datetimes import utc_iso
from service.runs import search
from service.schemas import MAX_ID, RunOut, RunPage
from service.verification.verdicts import is_reference

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
    spot_check: str | None = None  # pending, verified, failed, error or none
    tag: str | None = None  # runs with this tag (through run_tags' (tag, run_id) index)
    search: str | None = None  # `params.x = 1 and metrics.y > 0.9` (service.runs.search)
    archived: str = "false"  # archived runs: "false" left out, "true" only them, "any"


def _filtered(query: Select[Any], filters: RunFilters, *, verdicts: bool) -> Select[Any]:
    """`query` narrowed to `filters`; with `verdicts`, joined to each run's verdict (if
    any), so that it can select `Verdict.verdict`."""
    query = narrowed(query.where(Run.kind == filters.kind), Run.archived_at, filters.archived)
    if filters.spot_check == "none":
        query = query.where(Run.spot_check.is_(None))
    elif filters.spot_check is not None:
        query = query.where(Run.spot_check == filters.spot_check)
    if filters.status is not None:
        query = query.where(Run.status == filters.status)
    if filters.experiment_id is not None:
        query = query.where(Run.experiment_id == filters.experiment_id)
    if filters.tag is not None:
        query = query.where(exists().where(RunTag.run_id == Run.id, RunTag.tag == filters.tag))
    verdict = filters.verdict
    if verdict in ("identical", "diverged", "incomparable"):
        return query.join(Verdict, Verdict.run_id == Run.id).where(Verdict.verdict == verdict)
    if verdicts or verdict == "none":
        # One verdict per run at most (unique run_id): the join repeats no run.
        query = query.outerjoin(Verdict, Verdict.run_id == Run.id)
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
    status: bool,
    experiment: bool,
    verdict: str | None,
    after_cursor: bool,
    spot_check: str | None,
    tag: bool = False,
    archived: str = "false",
) -> Select[Any]:
    """The statement of a page for this shape of filters, built once (building one costs
    more than running it): the filter values, the cursor's id, offset and limit are bound
    when it runs. Datetimes come back as the text the API writes (`utc_iso`)."""
    shape = RunFilters(
        kind=bindparam("kind"),  # type: ignore[arg-type]
        status=bindparam("status") if status else None,  # type: ignore[arg-type]
        experiment_id=bindparam("experiment_id") if experiment else None,  # type: ignore[arg-type]
        verdict=verdict,
        spot_check=spot_check,
        tag=bindparam("tag") if tag else None,  # type: ignore[arg-type]
        archived=archived,
    )
    query = _filtered(select(*_page_columns()), shape, verdicts=True)
    if after_cursor:
        query = query.where(Run.id < bindparam("before"))
    return query.order_by(Run.id.desc()).offset(bindparam("offset")).limit(bindparam("limit"))


@cache
def _page_columns() -> tuple[ColumnElement[Any], ...]:
    """What a page selects of each run: RunOut's fields, in their order (the order its JSON
    is written in), datetimes as the text the API writes (`utc_iso`)."""
    run_columns = {c.key: c for c in out_columns()}
    derived: dict[str, ColumnElement[Any]] = {
        "verdict": Verdict.__table__.c.verdict,
        # The reference marks come with the rows (a subquery for a rerun that succeeded):
        # a second statement for them cost a PostgreSQL page about a fifth of its time.
        "is_reference": is_reference(Run).label("is_reference"),
    }
    columns = []
    for name in RunOut.model_fields:
        column = derived.get(name)
        if column is None:
            found = run_columns[name]
            column = utc_iso(found).label(name) if isinstance(found.type, DateTime) else found
        columns.append(column)
    return tuple(columns)


def _typed_dict_of(model: CoreSchema) -> CoreSchema:
    """A model's core schema as a typed dict's: the same fields, serialized the same way,
    from a plain dict; a datetime (nullable or not) as the text `utc_iso` gives."""
    if model["type"] != "model" or model["schema"]["type"] != "model-fields":
        raise RuntimeError(f"not a plain model's schema: {model['type']}")
    fields: dict[str, core_schema.TypedDictField] = {}
    for name, field in model["schema"]["fields"].items():
        schema = field["schema"]
        inner = schema["schema"] if schema["type"] == "nullable" else schema
        if inner["type"] == "datetime":
            inner = core_schema.str_schema()
        elif inner["type"] == "list" and inner.get("items_schema", {}).get("type") == "model":
            inner = core_schema.list_schema(_typed_dict_of(inner["items_schema"]))
        if schema["type"] == "nullable":
            inner = core_schema.nullable_schema(inner)
        fields[name] = core_schema.typed_dict_field(inner)
    return core_schema.typed_dict_schema(fields, config=model.get("config"))


@cache
def _page_serializer() -> SchemaSerializer:
    """Writes a page document as `RunPage.model_dump_json` writes the same page.

    Its rows come from typed columns, so validating them into models first checked nothing
    the database had not, and cost a PostgreSQL page about as much as writing its JSON.
    The serializer still checks each value against its field (`to_json(warnings="error")`)."""
    return SchemaSerializer(_typed_dict_of(RunPage.__pydantic_core_schema__))


def page_json(page: dict[str, Any]) -> bytes:
    """The JSON of a document from `list_runs`, as the API answers it."""
    return _page_serializer().to_json(page, warnings="error")


def list_runs(
    *,
    db: Connection,
    filters: RunFilters,
    limit: int,
    cursor: str | None = None,
    offset: int = 0,
    count: bool = False,
) -> dict[str, Any]:
    """A page of runs matching `filters`, newest first, after `cursor` (and `offset`): a
    document shaped as `RunPage`, datetimes as ISO text (see `page_json`)."""
    query = _page_query(
        filters.status is not None,
        filters.experiment_id is not None,
        filters.verdict,
        cursor is not None,
        filters.spot_check,
        filters.tag is not None,
        filters.archived,
    )
    searched = search.conditions(search.parse(filters.search)) if filters.search else []
    if searched:
        query = query.where(*searched)
    values: dict[str, Any] = {"kind": filters.kind, "offset": offset, "limit": limit + 1}
    if filters.tag is not None:
        values["tag"] = filters.tag
    if filters.status is not None:
        values["status"] = filters.status
    if filters.experiment_id is not None:
        values["experiment_id"] = filters.experiment_id
    if cursor is not None:
        values["before"] = decode_cursor(cursor)
    # Core rows, not ORM entities: a list shows columns only.
    result = db.execute(query, values)
    keys = tuple(result.keys())
    rows = [dict(zip(keys, row, strict=True)) for row in result.all()]
    more = len(rows) > limit
    rows = rows[:limit]
    total = None
    if count:
        matching = _filtered(select(Run.id), filters, verdicts=False).where(*searched).subquery()
        total = db.scalar(select(func.count()).select_from(matching))
    return {
        "items": rows,
        "next_cursor": encode_cursor(rows[-1]["id"]) if more else None,
        "total": total,
        "limit": limit,
        "offset": offset,
    }
