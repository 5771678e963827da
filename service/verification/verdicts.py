"""Verdicts: every successful rerun compared with its family's reference run."""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from typing import Any

from sqlalchemy import (
    ColumnElement,
    Integer,
    Select,
    String,
    and_,
    any_,
    bindparam,
    case,
    false,
    func,
    select,
    true,
)
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.orm import QueryableAttribute, Session, aliased
from sqlalchemy.orm.util import AliasedClass

from service.persistence.models import Run, TracePointRow, Verdict
from service.verification.comparisons import compare

# What a trace point shows, in the API and to a comparison.
TRACE_FIELDS = ("kind", "epoch", "step", "fingerprint", "variables")


@cache
def _trace_query() -> Select[Any]:
    # Built once (building a statement costs more than running this one); the id is bound.
    columns = TracePointRow.__table__.columns
    return (
        select(*(columns[name] for name in TRACE_FIELDS))
        .where(columns.run_id == bindparam("run_id"))
        .order_by(columns.seq)
    )


def trace_of(db: Session, run_id: int) -> list[dict[str, Any]]:
    """A run's trace points in recorded order."""
    return [dict(row) for row in db.execute(_trace_query(), {"run_id": run_id}).mappings()]


@dataclass(frozen=True)
class FamilyHead:
    """What decides a family's verdicts: its reference (first successful training) and its
    oldest run still queued or running, until which the reference and verdicts may change."""

    reference: int | None
    oldest_unfinished: int | None


def _in_bound_ids(column: QueryableAttribute[Any], name: str, dialect: str) -> ColumnElement[bool]:
    """`column IN (ids)`, the ids bound as one parameter whatever their number.

    An expanding IN renders one placeholder per id at every execution: SQLAlchemy builds
    the statement's text anew each time (0.15 ms of a PostgreSQL page's 50 families, 0.035
    ms on SQLite), and on PostgreSQL every length of list is another statement to prepare.
    PostgreSQL takes the list as one array; SQLite as one JSON array read by json_each.
    Both still look every id up in the column's index. Bind `_bound_ids(dialect, ids)`.
    """
    if dialect == "postgresql":
        return column == any_(bindparam(name, type_=ARRAY(Integer)))
    if dialect == "sqlite":
        each = func.json_each(bindparam(name, type_=String)).table_valued("value")
        return column.in_(select(each.c.value))
    return column.in_(bindparam(name, expanding=True))


def _bound_ids(dialect: str, ids: set[int]) -> Any:
    """The value of an `_in_bound_ids` parameter for these ids on this dialect."""
    ordered = sorted(ids)
    return json.dumps(ordered) if dialect == "sqlite" else ordered


def _succeeded_training(run: type[Run] | AliasedClass[Run]) -> ColumnElement[bool]:
    # What a family's reference is the first of (by id).
    return and_(run.status == "succeeded", run.kind == "train")


def is_reference(run: type[Run]) -> ColumnElement[bool]:
    """Whether the statement's run is its family's reference, as a column to select with it:
    the family's first successful training (so a family's first run once it succeeds).

    A family's first run (`family_id == id`) is its oldest: every rerun and audit copy
    joins a family after it. So a later member is the reference only if that first run is
    not a successful training, and one look at that run by primary key settles the rest
    in most families. Only where it fails is the family searched, every row of it: when
    every rerun did that, a page of 50 reruns of one family of 200 cost PostgreSQL 1.8-2.0
    ms of CPU and SQLite 2.2 ms, against 0.43-0.50 and 0.33 ms this way."""
    member = aliased(Run)
    head = aliased(Run)
    # Status and kind inside MIN, as in `_heads_query`: in WHERE they made SQLite read
    # every successful run of the table by the (kind, status) index.
    first = func.min(case((_succeeded_training(member), member.id)))
    reference = select(first).where(member.family_id == run.family_id).scalar_subquery()
    head_succeeded = (
        select(_succeeded_training(head)).where(head.id == run.family_id).scalar_subquery()
    )
    return case(
        (~and_(_succeeded_training(run), run.family_id.is_not(None)), false()),
        (run.family_id == run.id, true()),
        (head_succeeded, false()),
        else_=func.coalesce(reference == run.id, false()),
    )


@cache
def _heads_query(unfinished: bool, dialect: str) -> Select[Any]:
    # Built once per shape and dialect; the families are bound as one value. Filtering on
    # status and kind in WHERE let SQLite pick the (kind, status) index and read every
    # successful run of the table; inside MIN it reads the families' rows by the family
    # index, and answers one row per family. Reads that need the reference only ask for it
    # alone (the second column cost a page of runs 0.05-0.1 ms).
    columns = [Run.family_id, func.min(case((_succeeded_training(Run), Run.id)))]
    if unfinished:
        columns.append(func.min(case((Run.status.in_(("queued", "running")), Run.id))))
    members = _in_bound_ids(Run.family_id, "families", dialect)
    return select(*columns).where(members).group_by(Run.family_id)


def _heads(db: Session, families: set[int], *, unfinished: bool) -> Any:
    # Core rows from the session's connection: no ORM result handling for two or three
    # columns. That path does not flush pending changes by itself, so they are flushed
    # first, as `db.execute` would (a no-op with none, as on every read path).
    db.flush()
    dialect = db.get_bind().dialect.name
    query = _heads_query(unfinished, dialect)
    return db.connection().execute(query, {"families": _bound_ids(dialect, families)})


def family_heads(db: Session, families: set[int]) -> dict[int, FamilyHead]:
    """The head of each of these families that has members, by family id, in one query."""
    if not families:
        return {}
    found = _heads(db, families, unfinished=True)
    return {family: FamilyHead(first, oldest) for family, first, oldest in found}


def family_references(db: Session, families: set[int]) -> dict[int, int]:
    """The reference run of each of these families that has one, by family id."""
    if not families:
        return {}
    found = _heads(db, families, unfinished=False).all()
    return {family: first for family, first in found if first is not None}


def update_family(*, db: Session, family_id: int, max_checkpoint_bytes: int | None = None) -> None:
    """Give a verdict to every successful run of the family against its reference.

    The reference is the family's first successful run (lowest id); it has no verdict. The
    stored report is the full comparison (divergence, sizes, data, environment); a
    checkpoint beyond `max_checkpoint_bytes` is not measured, and the report says so.
    Only runs whose final fingerprint the server verified succeed, so only they count.
    """
    runs = db.scalars(
        select(Run)
        .where(Run.family_id == family_id, Run.status == "succeeded", Run.kind == "train")
        .order_by(Run.id)
    ).all()
    if not runs:
        return
    reference, others = runs[0], runs[1:]
    for run in others:
        current = db.scalar(select(Verdict).where(Verdict.run_id == run.id))
        if current is not None and current.reference_run_id == reference.id:
            continue
        report = compare(
            db, reference, run, max_checkpoint_bytes=max_checkpoint_bytes, strict=False
        )
        if current is None:
            db.add(
                Verdict(
                    run_id=run.id,
                    reference_run_id=reference.id,
                    verdict=report["verdict"],
                    report=report,
                )
            )
        else:
            current.reference_run_id, current.verdict = reference.id, report["verdict"]
            current.report = report
    stale = db.scalar(select(Verdict).where(Verdict.run_id == reference.id))
    if stale is not None:
        db.delete(stale)
