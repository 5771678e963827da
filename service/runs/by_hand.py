"""Runs of a training script its user runs by hand (`python train.py` with the service
configured): the script records its experiment and run here when it starts, and reports
its result itself when it ends. No worker trains such a run and none claims it; nothing
checks its final fingerprint against a checkpoint (it uploads none), which its
`reported_by` says. Its rerun (`?on_worker=true`) retrains it on a worker."""

from __future__ import annotations

from sqlalchemy.orm import Session

from service.auth.tokens import Principal, audit
from service.errors import Conflict, Forbidden, InvalidSpec, NotFound
from service.persistence.models import TERMINAL_STATUSES, Run, utcnow
from service.runs.queue import take_result
from worker.result import JobResult


def record_result(
    *,
    db: Session,
    run_id: int,
    result: JobResult,
    principal: Principal,
    max_sortable_metrics: int = 64,
) -> Run:
    """Record the result a run by hand reports of itself. A report repeated after a lost
    answer gets the run as recorded; only the token that started the run (or an admin)
    may report it."""
    run = db.get(Run, run_id, with_for_update=True, populate_existing=True)
    if run is None:
        raise NotFound(f"run {run_id} does not exist")
    if run.origin != "by_hand":
        raise Conflict(f"run {run_id} is trained by a worker, which reports its result")
    if principal.role != "admin" and run.submitter_id != principal.token_id:
        raise Forbidden(f"run {run_id} was started with another token")
    if run.status in TERMINAL_STATUSES:
        if run.final_fingerprint == result.final_fingerprint and run.status == result.status:
            return run
        raise Conflict(f"run {run_id} is already {run.status}")
    expected = run.experiment.spec_hash
    if result.spec_hash != expected:
        raise InvalidSpec(
            f"the result is of spec {result.spec_hash}, run {run_id} of {expected}",
            errors=[{"loc": "spec_hash", "msg": "not the run's spec hash"}],
        )
    run.status = "succeeded" if result.status == "succeeded" else "failed"
    run.finished_at = utcnow()
    run.final_fingerprint = result.final_fingerprint if run.status == "succeeded" else None
    run.error = result.error.model_dump() if result.error else None
    take_result(db, run, result, max_sortable_metrics=max_sortable_metrics)
    run.reported_by = {
        "by_hand": True,
        "token_id": principal.token_id,
        "token": principal.name,
        "image": None,
        "fingerprint": {
            "outcome": "not_checked",
            "reported": result.final_fingerprint,
            "computed": None,
            "message": "run by hand: no checkpoint was uploaded to check it against",
        },
        "at": utcnow().isoformat() + "Z",
    }
    audit(
        db=db,
        actor=principal,
        action="run.report_by_hand",
        target_type="run",
        target_id=run.id,
        details={"status": run.status, "final_fingerprint": run.final_fingerprint},
    )
    db.commit()
    return run
