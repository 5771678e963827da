"""Reproducibility audits: N copies of one experiment on different workers; do all agree?"""

from __future__ import annotations

from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from service.errors import NotFound
from service.persistence.models import TERMINAL_STATUSES, Run, Worker


def audit_view(db: Session, audit_id: int) -> dict[str, Any]:
    """An audit's copies, where each ran, and whether all agree bitwise."""
    runs = db.scalars(select(Run).where(Run.audit_id == audit_id).order_by(Run.id)).all()
    if not runs:
        raise NotFound(f"reproducibility audit {audit_id} does not exist")
    workers = {
        w.id: w.name
        for w in db.scalars(
            select(Worker).where(Worker.id.in_({r.worker_id for r in runs if r.worker_id}))
        )
    }
    finished = all(r.status in TERMINAL_STATUSES for r in runs)
    succeeded = [r for r in runs if r.status == "succeeded"]
    fingerprints = {r.final_fingerprint for r in succeeded}
    copies = [
        {
            "id": r.id,
            "status": r.status,
            "worker_id": r.worker_id,
            "worker": workers.get(r.worker_id) if r.worker_id else None,
            "final_fingerprint": r.final_fingerprint,
            "verdict": r.verdict_record.verdict if r.verdict_record else None,
        }
        for r in runs
    ]
    agree: bool | None = None
    if finished:
        agree = len(succeeded) == len(runs) and len(fingerprints) == 1
    distinct = len({r.worker_id for r in runs if r.worker_id})
    if not finished:
        left = sum(r.status not in TERMINAL_STATUSES for r in runs)
        summary = f"{left} of {len(runs)} copies still to finish"
    elif agree:
        summary = f"all {len(runs)} copies identical on {distinct} workers: {fingerprints.pop()}"
    elif len(succeeded) < len(runs):
        summary = f"{len(runs) - len(succeeded)} of {len(runs)} copies did not succeed"
    else:
        summary = f"the copies disagree: {len(fingerprints)} different final fingerprints"
    return {
        "id": audit_id,
        "experiment_id": runs[0].experiment_id,
        "copies": copies,
        "finished": finished,
        "agree": agree,
        "distinct_workers": distinct,
        "summary": summary,
    }
