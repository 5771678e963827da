"""Building API views of database rows (one place for the run's derived fields).

The run views are read on every poll of a client and every page of a listing, so each is
built in a fixed, small number of queries: list rows read only the columns a `RunOut`
shows (not the provenance, metrics and traces a finished run carries), and the detail reads
everything it shows in one statement.
"""

from __future__ import annotations

from collections.abc import Iterable
from functools import cache
from typing import Any

from pydantic import ValidationError
from sqlalchemy import ColumnElement, Select, bindparam, select
from sqlalchemy.orm import Session

from service.config import Settings
from service.persistence.models import Experiment, Run, SpotCheck, TracePointRow, Verdict
from service.persistence.rows_as_json import json_rows
from service.runs import queue, resume_points
from service.schemas import ComparisonReport, RunDetail, RunOut, SpotCheckOut
from service.verification import replay_identity
from service.verification.comparisons import compare
from service.verification.verdicts import TRACE_FIELDS, is_reference

# RunOut fields that are not columns of a run.
_DERIVED = frozenset({"verdict", "is_reference"})


@cache
def out_columns() -> tuple[ColumnElement[Any], ...]:
    """The columns of `runs` a RunOut shows (whatever fields RunOut gains later)."""
    table = Run.__table__.columns
    missing = set(RunOut.model_fields) - _DERIVED - set(table.keys())
    if missing:
        raise RuntimeError(f"RunOut fields that are not run columns: {sorted(missing)}")
    return tuple(table[name] for name in RunOut.model_fields if name not in _DERIVED)


def _row_of(run: Run) -> dict[str, Any]:
    return {name: getattr(run, name) for name in _out_names()}


@cache
def _out_names() -> tuple[str, ...]:
    return tuple(name for name in RunOut.model_fields if name not in _DERIVED)


@cache
def _marks_query() -> Select[int, str, bool]:
    # A run's verdict and reference mark, as a page and the detail read them with the run.
    return (
        select(Run.id, Verdict.verdict, is_reference(Run).label("is_reference"))
        .outerjoin(Verdict, Verdict.run_id == Run.id)
        .where(Run.id.in_(bindparam("ids", expanding=True)))
    )


def run_outs(db: Session, runs: Iterable[Run]) -> list[RunOut]:
    """List views of loaded runs with their verdicts and reference marks (one query)."""
    rows = [_row_of(r) for r in runs]
    if not rows:
        return []
    found = db.execute(_marks_query(), {"ids": [r["id"] for r in rows]})
    marks = {run_id: {"verdict": v, "is_reference": ref} for run_id, v, ref in found}
    return [RunOut.model_validate({**r, **marks[r["id"]]}) for r in rows]


def run_out(db: Session, run: Run) -> RunOut:
    """The list view of one run, with its verdict and reference mark."""
    return run_outs(db, [run])[0]


def _report(db: Session, run_id: int, row: Any) -> ComparisonReport | None:
    """The stored report; one stored in an older format is built again for this answer."""
    if row.verdict_report is None:
        return None
    try:
        return ComparisonReport.model_validate(row.verdict_report)
    except ValidationError:
        reference = db.get_one(Run, row.reference_run_id)
        fresh = compare(db, reference, db.get_one(Run, run_id), strict=False)
        return ComparisonReport.model_validate(fresh)


# Columns of `runs` a detail shows beyond a RunOut's.
_DETAIL_COLUMNS = (
    "provenance",
    "metrics",
    "step_metrics",
    "data_fingerprints",
    "trace_granularity",
    "result_summary",
    "reported_by",
    "notes",
)


@cache
def _detail_names() -> tuple[str, ...]:
    # Fields of a detail read as they are from its query's columns of the same name.
    return (
        *_out_names(),
        *_DETAIL_COLUMNS,
        *("spec", "spec_hash", "seed", "verdict", "reference_run_id", "is_reference"),
    )


@cache
def _detail_query() -> Select[Any]:
    # Built once (building it cost more than running it); the id is bound. Everything a
    # detail shows, trace and checkpoint names included, in one statement: on PostgreSQL
    # each statement more cost a read about a quarter of a millisecond of the server's CPU.
    runs = Run.__table__.columns
    points = TracePointRow.__table__.columns
    return (
        select(
            *out_columns(),
            *(runs[name] for name in _DETAIL_COLUMNS),
            Experiment.spec,
            Experiment.spec_hash,
            Experiment.seed,
            Verdict.verdict,
            Verdict.report.label("verdict_report"),
            Verdict.reference_run_id,
            select(json_rows(points.seq, *(points[name] for name in TRACE_FIELDS)))
            .where(points.run_id == runs.id)
            .scalar_subquery()
            .label("trace"),
            resume_points.checkpoint_files(runs.id).label("checkpoint_files"),
            is_reference(Run).label("is_reference"),
        )
        .join_from(Run, Experiment, Run.experiment_id == Experiment.id)
        .outerjoin(Verdict, Verdict.run_id == Run.id)
        .where(runs.id == bindparam("run_id"))
    )


def run_detail(db: Session, run_id: int, *, settings: Settings) -> RunDetail | None:
    """Everything recorded about a run, and why it waits if it is queued (None if there is
    no such run)."""
    # Core rows from the session's connection: no ORM result handling (a read session has
    # no changes to flush first).
    row = db.connection().execute(_detail_query(), {"run_id": run_id}).one_or_none()
    if row is None:
        return None
    checkpoint_epoch, checkpoint_step = resume_points.checkpoint_position(
        row.checkpoint_files, row.spec
    )
    waiting = (
        queue.waiting_reason(
            db=db,
            required_image=row.required_image,
            replicas=row.replicas,
            settings=settings,
            needs_code=(row.spec or {}).get("code") is not None,
            required_hardware=row.required_hardware,
            hosts=int(((row.spec or {}).get("distribution") or {}).get("hosts", 1)),
            run_id=row.id,
            progress=row.progress,
        )
        if row.status == "queued"
        else None
    )
    return RunDetail.model_validate(
        {
            **{name: row._mapping[name] for name in _detail_names()},
            "trace": [dict(zip(TRACE_FIELDS, p[1:], strict=True)) for p in sorted(row.trace)],
            "verdict_report": _report(db, run_id, row),
            "checkpoint_epoch": checkpoint_epoch,
            "checkpoint_step": checkpoint_step,
            "waiting_reason": waiting,
        }
    )


def spot_check_out(
    check: SpotCheck, *, db: Session | None = None, settings: Settings | None = None
) -> SpotCheckOut:
    """The API view of a spot check; with `db` and `settings`, a pending one says why its
    replays wait, if no live worker may take them."""
    waiting = None
    if check.status == "pending" and db is not None and settings is not None:
        ids = [int(s["run_id"]) for s in check.segments]
        replays = db.scalars(select(Run).where(Run.id.in_(ids)))
        waiting = replay_identity.waiting_reason(db, replays, settings)
    return SpotCheckOut(
        waiting_reason=waiting,
        id=check.id,
        run_id=check.run_id,
        status=check.status,
        seed=str(check.seed),
        requested=check.requested,
        segments=list(check.segments),
        report=check.report,
        requested_by=check.requested_by,
        created_at=check.created_at,
        finished_at=check.finished_at,
    )
