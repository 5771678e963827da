"""Building API views of database rows (one place for the run's derived fields).

The run views are read on every poll of a client and every page of a listing, so each is
built in a fixed, small number of queries: list rows read only the columns a `RunOut`
shows (not the provenance, metrics and traces a finished run carries), and the detail reads
the run with its experiment in one query and its checkpoints once.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from functools import cache
from typing import Any

from pydantic import ValidationError
from sqlalchemy import ColumnElement, Select, bindparam, select
from sqlalchemy.orm import Session, joinedload

from service import queue, resume_points
from service.comparisons import compare
from service.config import Settings
from service.models import Run, Verdict
from service.schemas import ComparisonReport, RunDetail, RunOut
from service.verdicts import family_references, trace_of

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


def _trains_ok(row: dict[str, Any]) -> bool:
    return bool(row["status"] == "succeeded" and row["kind"] == "train" and row["family_id"])


def out_rows(db: Session, rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rows holding `out_columns()` (and `verdict`, when read with a join) completed with
    verdicts and reference marks into RunOut's fields, in at most two more queries whatever
    the page size."""
    if rows and "verdict" not in rows[0]:
        ids = [r["id"] for r in rows]
        found = db.execute(select(Verdict.run_id, Verdict.verdict).where(Verdict.run_id.in_(ids)))
        verdicts = {run_id: verdict for run_id, verdict in found}
        rows = [{**r, "verdict": verdicts.get(r["id"])} for r in rows]
    # A family's first run is its reference once it succeeds (every other member is newer);
    # only the families of other successful members need a look.
    families = {r["family_id"] for r in rows if _trains_ok(r) and r["family_id"] != r["id"]}
    references = set(family_references(db, families).values())
    return [
        {
            **r,
            "is_reference": _trains_ok(r) and (r["family_id"] == r["id"] or r["id"] in references),
        }
        for r in rows
    ]


def outs_of_rows(db: Session, rows: Sequence[dict[str, Any]]) -> list[RunOut]:
    """RunOuts of rows holding `out_columns()` (see `out_rows`)."""
    return [RunOut.model_validate(row) for row in out_rows(db, rows)]


def _row_of(run: Run) -> dict[str, Any]:
    return {name: getattr(run, name) for name in _out_names()}


@cache
def _out_names() -> tuple[str, ...]:
    return tuple(name for name in RunOut.model_fields if name not in _DERIVED)


def run_outs(db: Session, runs: Iterable[Run]) -> list[RunOut]:
    """List views of loaded runs with their verdicts."""
    return outs_of_rows(db, [_row_of(r) for r in runs])


def run_out(db: Session, run: Run) -> RunOut:
    """The list view of one run, with its verdict."""
    return run_outs(db, [run])[0]


def _report(db: Session, verdict: Verdict | None) -> ComparisonReport | None:
    """The stored report; one stored in an older format is built again and replaced."""
    if verdict is None:
        return None
    try:
        return ComparisonReport.model_validate(verdict.report)
    except ValidationError:
        fresh = compare(db, db.get_one(Run, verdict.reference_run_id), verdict.run, strict=False)
        verdict.report, verdict.verdict = fresh, fresh["verdict"]
        db.commit()
        return ComparisonReport.model_validate(fresh)


@cache
def _run_query() -> Select[Run]:
    # Built once (building it, options included, cost more than running it); the id is bound.
    return (
        select(Run)
        .options(joinedload(Run.experiment), joinedload(Run.verdict_record))
        .where(Run.id == bindparam("run_id"))
    )


def load_run(db: Session, run_id: int) -> Run | None:
    """The run with its experiment and verdict, in one query (None if there is none)."""
    found: Run | None = db.execute(_run_query(), {"run_id": run_id}).unique().scalar_one_or_none()
    return found


def _is_reference(db: Session, run: Run) -> bool:
    if run.status != "succeeded" or run.kind != "train" or run.family_id is None:
        return False
    return (
        run.family_id == run.id
        or family_references(db, {run.family_id}).get(run.family_id) == run.id
    )


def run_detail(db: Session, run: Run, *, settings: Settings | None = None) -> RunDetail:
    """Everything recorded about a run (with `settings`, also why a queued run waits)."""
    verdict = run.verdict_record
    # Both checkpoint fields come from one read of the names of the run's checkpoint files.
    checkpoint_epoch, checkpoint_step = resume_points.checkpoint_position(db, run)
    return RunDetail.model_validate(
        {
            **_row_of(run),
            "verdict": verdict.verdict if verdict else None,
            "is_reference": _is_reference(db, run),
            "spec": run.experiment.spec,
            "spec_hash": run.experiment.spec_hash,
            "seed": run.experiment.seed,
            "provenance": run.provenance,
            "metrics": run.metrics,
            "data_fingerprints": run.data_fingerprints,
            "trace_granularity": run.trace_granularity,
            "trace": trace_of(db, run.id),
            "result_summary": run.result_summary,
            "verdict_report": _report(db, verdict),
            "reference_run_id": verdict.reference_run_id if verdict else None,
            "checkpoint_epoch": checkpoint_epoch,
            "checkpoint_step": checkpoint_step,
            "reported_by": run.reported_by,
            "waiting_reason": (
                queue.waiting_reason(db=db, run=run, settings=settings) if settings else None
            ),
        }
    )
