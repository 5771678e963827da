"""Building API views of database rows (one place for the run's derived fields)."""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import ValidationError
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from service import queue
from service.comparisons import compare
from service.config import Settings
from service.models import Run, Verdict
from service.schemas import ComparisonReport, RunDetail, RunOut
from service.verdicts import trace_of


def run_outs(db: Session, runs: Sequence[Run]) -> list[RunOut]:
    """List views of runs with their verdicts, in two queries whatever the page size."""
    ids = [r.id for r in runs]
    rows = db.execute(select(Verdict.run_id, Verdict.verdict).where(Verdict.run_id.in_(ids)))
    verdicts = {run_id: verdict for run_id, verdict in rows}
    families = {r.family_id for r in runs if r.status == "succeeded"}
    references = (
        set(
            db.scalars(
                select(func.min(Run.id))
                .where(Run.family_id.in_(families), Run.status == "succeeded")
                .group_by(Run.family_id)
            )
        )
        if families
        else set()
    )
    outs = []
    for run in runs:
        out = RunOut.model_validate(run)
        out.verdict = verdicts.get(run.id)
        out.is_reference = run.id in references
        outs.append(out)
    return outs


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


def run_detail(db: Session, run: Run, *, settings: Settings | None = None) -> RunDetail:
    """Everything recorded about a run (with `settings`, also why a queued run waits)."""
    base = run_out(db, run).model_dump()
    verdict = db.scalar(select(Verdict).where(Verdict.run_id == run.id))
    checkpoint = queue.latest_checkpoint(db, run.id)
    return RunDetail(
        **base,
        spec=run.experiment.spec,
        spec_hash=run.experiment.spec_hash,
        seed=run.experiment.seed,
        provenance=run.provenance,
        metrics=run.metrics,
        data_fingerprints=run.data_fingerprints,
        trace_granularity=run.trace_granularity,
        trace=trace_of(db, run.id),
        result_summary=run.result_summary,
        verdict_report=_report(db, verdict),
        reference_run_id=verdict.reference_run_id if verdict else None,
        checkpoint_epoch=checkpoint[0] if checkpoint else None,
        reported_by=run.reported_by,
        waiting_reason=(
            queue.image_waiting_reason(db=db, run=run, settings=settings) if settings else None
        ),
    )
