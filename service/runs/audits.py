"""Reproducibility audits: N copies of one experiment on different workers; do all agree?"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from service.errors import NotFound
from service.persistence.models import TERMINAL_STATUSES, Run, Worker

# Copies that ran on one worker show the training is deterministic there; they prove
# nothing about other machines (another CPU, GPU or library build).
ONE_WORKER_CAVEAT = (
    "all copies ran on one worker: this shows determinism on that machine, not across machines"
)


def audit_view(db: Session, audit_id: int) -> dict[str, Any]:
    """An audit's copies, where each ran, and whether all agree bitwise."""
    runs = db.scalars(select(Run).where(Run.audit_id == audit_id).order_by(Run.id)).all()
    if not runs:
        raise NotFound(f"reproducibility audit {audit_id} does not exist")
    return _view(audit_id, runs, _worker_names(db, runs))


def audit_list(db: Session, *, limit: int) -> list[dict[str, Any]]:
    """The newest `limit` audits, newest first, each as `audit_view` gives it."""
    ids = db.scalars(
        select(Run.audit_id)
        .where(Run.audit_id.is_not(None))
        .group_by(Run.audit_id)
        .order_by(Run.audit_id.desc())
        .limit(limit)
    ).all()
    runs = db.scalars(select(Run).where(Run.audit_id.in_(ids)).order_by(Run.id)).all()
    names = _worker_names(db, runs)
    by_audit: dict[int, list[Run]] = {}
    for run in runs:
        by_audit.setdefault(int(run.audit_id or 0), []).append(run)
    return [_view(i, by_audit[i], names) for i in ids if i in by_audit]


def _worker_names(db: Session, runs: Sequence[Run]) -> dict[int, str]:
    wanted = {r.worker_id for r in runs if r.worker_id}
    return {w.id: w.name for w in db.scalars(select(Worker).where(Worker.id.in_(wanted)))}


def _view(audit_id: int, runs: Sequence[Run], workers: Mapping[int, str]) -> dict[str, Any]:
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
        on = "one worker" if distinct == 1 else f"{distinct} workers"
        summary = f"all {len(runs)} copies identical on {on}: {fingerprints.pop()}"
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
        "caveat": ONE_WORKER_CAVEAT if finished and distinct == 1 and len(runs) > 1 else None,
        "created_at": runs[0].created_at,
    }
