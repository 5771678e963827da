"""Retention: an archived run's files (checkpoints, exported model, job log) are removed once
it has been archived longer than `archive_retention_days`; its record (spec, provenance,
trace, metrics, verdicts) stays, and so do the rows that say what its files were.

The rules: a run is collected only when archived before the cutoff; the reference of a
family keeps its files while a rerun of it is not archived (its verdict and any later rerun
compare against them), as does the first run of a family while a rerun of it waits or
trains; a stored file shared with another run's artifact stays (files are
content-addressed). Every collection is in the audit log (`run.collect`).

Archiving an experiment archives its runs with it, so their files follow the same rules. A
dataset, model definition or code bundle archived before the cutoff loses its bytes once no
run that used it is left in the lists (every such run archived): a run in the lists can
still be rerun and compared, which needs them. Its record stays, new experiments may not
name it, and pushing the same file again restores it (`dataset.collect`, `.restore`, ...).

An admin may also delete an ended run for good (`DELETE /runs/{id}`), record and all, once
nothing refers to it (reruns, verdicts against it, refinements, spot checks)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import delete, exists, func, select
from sqlalchemy.orm import Session, aliased

from service.auth.tokens import Principal, audit
from service.errors import Conflict
from service.persistence.models import (
    TERMINAL_STATUSES,
    Artifact,
    ComparisonRecord,
    Refinement,
    Run,
    RunLogChunk,
    RunMetric,
    RunTag,
    SpotCheck,
    TracePointRow,
    Verdict,
    utcnow,
)
from service.runs.experiments import get_run
from service.storage import artifacts, blob_store, code_bundles, datasets, model_definitions
from service.storage.by_digest import ByDigest, Row

BATCH = 500  # runs collected per call (and read per query): a larger backlog, later calls
STORES: tuple[ByDigest[Any], ...] = (datasets.STORE, model_definitions.STORE, code_bundles.STORE)


@dataclass
class Collection:
    """What a collection removed (or, in a dry run, would remove)."""

    cutoff: datetime
    runs: list[int] = field(default_factory=list)
    files: int = 0
    bytes: int = 0
    kept: dict[int, str] = field(default_factory=dict)  # run -> why its files stay
    more: bool = False  # more runs are due than one call collects
    stored: list[StoredFile] = field(default_factory=list)  # datasets, ... whose bytes went
    stored_kept: list[StoredFile] = field(default_factory=list)  # archived, bytes kept: why


@dataclass
class StoredFile:
    """A dataset, model definition or code bundle that retention removed or kept."""

    kind: str
    digest: str
    bytes: int
    why: str | None = None


def why_kept(db: Session, run: Run) -> str | None:
    """Why an archived run's files must stay, or None."""
    rerun = aliased(Run)
    compared = db.scalars(
        select(Verdict.run_id)
        .join(rerun, rerun.id == Verdict.run_id)
        .where(Verdict.reference_run_id == run.id, rerun.archived_at.is_(None))
        .order_by(Verdict.run_id)
        .limit(3)
    ).all()
    if compared:
        listed = ", ".join(str(r) for r in compared)
        return f"the reference of reruns not archived ({listed})"
    waiting = db.scalar(
        select(func.min(rerun.id)).where(
            rerun.family_id == run.id, rerun.id != run.id, rerun.finished_at.is_(None)
        )
    )
    if waiting is not None:
        return f"the first run of its family, whose rerun {waiting} has not finished"
    return None


def collect(
    db: Session,
    *,
    retention_days: float,
    actor: Principal | None,
    dry_run: bool = False,
    now: datetime | None = None,
) -> Collection:
    """Remove the files of runs archived before now minus the retention (see the module)."""
    cutoff = (now or utcnow()) - timedelta(days=retention_days)
    found = Collection(cutoff=cutoff)
    has_files = exists().where(Artifact.run_id == Run.id) | exists().where(
        RunLogChunk.run_id == Run.id
    )
    last = 0
    while len(found.runs) < BATCH:
        due = db.scalars(
            select(Run)
            .where(
                Run.id > last,
                Run.archived_at <= cutoff,
                Run.files_collected_at.is_(None),
                has_files,
            )
            .order_by(Run.id)
            .limit(BATCH)
        ).all()
        if not due:
            break
        last = due[-1].id
        _collect_some(db, due, found, actor=actor, dry_run=dry_run, limit=BATCH)
    found.more = found.more or len(found.runs) >= BATCH
    for store in STORES:
        _collect_stored(db, store, found, actor=actor, dry_run=dry_run)
    return found


def _collect_stored(
    db: Session, store: ByDigest[Row], found: Collection, *, actor: Principal | None, dry_run: bool
) -> None:
    """Remove the bytes of the kind's files archived before the cutoff that no run in the
    lists used; the record stays (see the module)."""
    due = db.scalars(
        select(store.row)
        .where(store.row.archived_at <= found.cutoff, store.row.files_collected_at.is_(None))
        .order_by(store.row.id)
        .limit(BATCH)
    ).all()
    for row in due:
        listed = store.runs_listed(db, row.digest)
        if listed:
            why = f"runs not archived used it ({', '.join(map(str, listed))})"
            found.stored_kept.append(StoredFile(store.noun, row.digest, row.size, why))
            continue
        found.stored.append(StoredFile(store.noun, row.digest, row.size))
        if dry_run:
            continue
        row.files_collected_at = utcnow()
        details = {"digest": row.digest, "bytes": row.size, "archived_at": str(row.archived_at)}
        audit(db=db, actor=actor, action=f"{store.target_type}.collect",
              target_type=store.target_type, target_id=row.id, details=details)  # fmt: skip
        db.commit()  # the record first: should the removal fail, the bytes only linger
        blob_store.delete(row.storage_url)


def _collect_some(
    db: Session,
    due: Sequence[Run],
    found: Collection,
    *,
    actor: Principal | None,
    dry_run: bool,
    limit: int,
) -> None:
    for run in due:
        if len(found.runs) >= limit:
            found.more = True
            return
        reason = why_kept(db, run)
        if reason is not None:
            found.kept[run.id] = reason
            continue
        files = db.scalars(select(Artifact).where(Artifact.run_id == run.id)).all()
        size = sum(a.size for a in files)
        found.runs.append(run.id)
        found.files += len(files)
        found.bytes += size
        if dry_run:
            continue
        db.execute(delete(RunLogChunk).where(RunLogChunk.run_id == run.id))
        run.files_collected_at = utcnow()
        details = {"files": len(files), "bytes": size, "archived_at": str(run.archived_at)}
        audit(db=db, actor=actor, action="run.collect", target_type="run", target_id=run.id,
              details=details)  # fmt: skip
        artifacts.delete(db, files)  # the rows, and the stored files no other row names; commits
        db.commit()


def _referring(db: Session, run_id: int) -> list[str]:
    """What still refers to the run, so deleting it would leave others without it."""
    found = []
    other = aliased(Run)
    reruns = db.scalars(
        select(other.id)
        .where(
            other.id != run_id,
            (other.rerun_of_id == run_id)
            | (other.family_id == run_id)
            | (other.audit_id == run_id),
        )
        .order_by(other.id)
        .limit(5)
    ).all()
    if reruns:
        found.append(f"runs {', '.join(map(str, reruns))} are its reruns, copies or replays")
    judged = db.scalars(
        select(Verdict.run_id).where(Verdict.reference_run_id == run_id, Verdict.run_id != run_id)
    ).all()
    if judged:
        found.append(f"the verdicts of runs {', '.join(map(str, judged[:5]))} are against it")
    named = (Refinement.run_a_id == run_id) | (Refinement.run_b_id == run_id)
    named |= (Refinement.refine_a_id == run_id) | (Refinement.refine_b_id == run_id)
    if db.scalar(select(func.count(Refinement.id)).where(named)):
        found.append("a refinement (per-step re-trace) names it")
    if db.scalar(select(func.count(SpotCheck.id)).where(SpotCheck.run_id == run_id)):
        found.append("it has spot checks")
    return found


def delete_run(db: Session, *, run_id: int, actor: Principal | None) -> None:
    """Delete an ended run for good: its record, its files (those no other run shares) and
    its log. Refused (Conflict) while anything refers to it: delete its reruns first, and
    a family's reference last. Audit-logged (`run.delete`)."""
    run = get_run(db, run_id)
    if run.status not in TERMINAL_STATUSES:
        raise Conflict(f"run {run_id} is {run.status}: cancel it or let it end first")
    blockers = _referring(db, run.id)
    if blockers:
        raise Conflict(f"run {run_id} cannot be deleted: {'; '.join(blockers)}")
    files = db.scalars(select(Artifact).where(Artifact.run_id == run.id)).all()
    details = {
        "experiment_id": run.experiment_id,
        "status": run.status,
        "final_fingerprint": run.final_fingerprint,
        "files": len(files),
    }
    artifacts.delete(db, files)  # the rows, and the stored files no other row names; commits
    for table, column in (
        (RunLogChunk, RunLogChunk.run_id),
        (TracePointRow, TracePointRow.run_id),
        (Verdict, Verdict.run_id),
        (RunTag, RunTag.run_id),
        (RunMetric, RunMetric.run_id),
    ):
        db.execute(delete(table).where(column == run.id))
    db.execute(
        delete(ComparisonRecord).where(
            (ComparisonRecord.run_a_id == run.id) | (ComparisonRecord.run_b_id == run.id)
        )
    )
    db.execute(delete(Run).where(Run.id == run.id))
    audit(db=db, actor=actor, action="run.delete", target_type="run", target_id=run_id,
          details=details)  # fmt: skip
    db.commit()
