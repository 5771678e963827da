"""Building API views of database rows (one place for the run's derived fields)."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from service import queue
from service.models import Run, Verdict
from service.schemas import RunDetail, RunOut
from service.verdicts import trace_of


def _is_reference(db: Session, run: Run) -> bool:
    if run.status != "succeeded":
        return False
    first = db.scalar(
        select(Run.id)
        .where(Run.family_id == run.family_id, Run.status == "succeeded")
        .order_by(Run.id)
        .limit(1)
    )
    return first == run.id


def run_out(db: Session, run: Run) -> RunOut:
    """The list view of a run, with its verdict."""
    out = RunOut.model_validate(run)
    verdict = db.scalar(select(Verdict).where(Verdict.run_id == run.id))
    out.verdict = verdict.verdict if verdict else None
    out.is_reference = _is_reference(db, run)
    return out


def run_detail(db: Session, run: Run) -> RunDetail:
    """Everything recorded about a run."""
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
        verdict_report=verdict.report if verdict else None,
        reference_run_id=verdict.reference_run_id if verdict else None,
        checkpoint_epoch=checkpoint[0] if checkpoint else None,
    )
