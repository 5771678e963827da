"""What people say of a run: its name, notes and tags (`PATCH /runs/{id}`), and whether it
or its experiment is archived; every change audit-logged.

A run's tags are kept in order on the run (`runs.tags`, read with a page of runs) and one
row each in `run_tags` (read by the runs list's `tag` filter through its index); this
module is the only writer of both, so they never disagree.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, cast

from sqlalchemy import CursorResult, delete, select, update
from sqlalchemy.orm import Session

from service.auth.tokens import Principal, audit
from service.errors import Conflict, InvalidSpec
from service.persistence.models import (
    TERMINAL_STATUSES,
    Experiment,
    ExperimentParam,
    Run,
    RunTag,
    utcnow,
)
from service.runs.experiments import get_experiment, get_run
from service.schemas import MAX_TAGS, RunEdit


def edit(*, db: Session, run_id: int, change: RunEdit, actor: Principal | None) -> Run:
    """Apply the fields `change` gives to the run; record what changed in the audit log."""
    run = get_run(db, run_id)
    given = change.model_fields_set
    changed: dict[str, Any] = {}
    if "name" in given:
        name = (change.name or "").strip() or None
        if name != run.name:
            changed["name"] = {"from": run.name, "to": name}
            run.name = name
    if "notes" in given:
        notes = (change.notes or "").strip() or None
        if notes != run.notes:
            changed["notes"] = {"from_chars": len(run.notes or ""), "to_chars": len(notes or "")}
            run.notes = notes
    tags = _tags_after(list(run.tags or []), change)
    if tags != list(run.tags or []):
        before = set(run.tags or [])
        changed["tags"] = {
            "added": [t for t in tags if t not in before],
            "removed": [t for t in run.tags or [] if t not in tags],
        }
        db.execute(delete(RunTag).where(RunTag.run_id == run.id, RunTag.tag.not_in(tags)))
        db.add_all(RunTag(run_id=run.id, tag=t) for t in tags if t not in before)
        run.tags = tags or None
    if changed:
        audit(
            db=db,
            actor=actor,
            action="run.edit",
            target_type="run",
            target_id=run.id,
            details=changed,
        )
    db.commit()
    return run


def _tags_after(current: list[str], change: RunEdit) -> list[str]:
    """The run's tags once `change` applies, in the order first given, each once."""
    base = (change.tags or []) if "tags" in change.model_fields_set else current
    removed = set(change.remove_tags)
    tags = [t for t in dict.fromkeys([*base, *change.add_tags]) if t not in removed]
    if len(tags) > MAX_TAGS:
        raise InvalidSpec(
            f"a run has at most {MAX_TAGS} tags; this change would give it {len(tags)}",
            errors=[{"loc": "body.tags", "msg": f"at most {MAX_TAGS} tags"}],
        )
    return tags


def archive(*, db: Session, run_id: int, archived: bool, actor: Principal | None) -> Run:
    """Archive an ended run (lists leave it out unless asked), or bring it back. Nothing of
    the run is removed; archiving one already archived changes nothing."""
    run = get_run(db, run_id)
    if archived and run.status not in TERMINAL_STATUSES:
        raise Conflict(f"run {run_id} is {run.status}: cancel it or let it end first")
    if (run.archived_at is not None) != archived:
        run.archived_at = utcnow() if archived else None
        action = "run.archive" if archived else "run.unarchive"
        audit(db=db, actor=actor, action=action, target_type="run", target_id=run.id)
    db.commit()
    return run


def archive_experiment(
    *, db: Session, experiment_id: int, archived: bool, actor: Principal | None
) -> Experiment:
    """Archive an experiment with its runs not archived yet (Conflict while one of them has
    not ended), or bring it back with the runs archived with it; runs archived on their own
    before stay archived. A rerun asked for later joins the lists as any new run does."""
    experiment = get_experiment(db, experiment_id)
    if (experiment.archived_at is not None) == archived:
        return experiment
    if archived:
        busy = db.scalars(
            select(Run.id)
            .where(Run.experiment_id == experiment.id, Run.status.not_in(TERMINAL_STATUSES))
            .order_by(Run.id)
            .limit(3)
        ).all()
        if busy:
            raise Conflict(
                f"experiment {experiment_id} has runs that have not ended "
                f"({', '.join(map(str, busy))}): cancel them or let them end first"
            )
        stamp: datetime | None = utcnow()
    else:
        stamp = None
    # The runs archived with it carry its very time stamp: that is how they come back.
    runs = update(Run).where(Run.experiment_id == experiment.id)
    if archived:
        runs = runs.where(Run.archived_at.is_(None)).values(archived_at=stamp)
    else:
        runs = runs.where(Run.archived_at == experiment.archived_at).values(archived_at=None)
    changed = cast(CursorResult[Any], db.execute(runs)).rowcount
    experiment.archived_at = stamp
    audit(
        db=db,
        actor=actor,
        action="experiment.archive" if archived else "experiment.unarchive",
        target_type="experiment",
        target_id=experiment.id,
        details={"runs": changed},
    )
    db.commit()
    return experiment


def delete_experiment(*, db: Session, experiment_id: int, actor: Principal | None) -> None:
    """Delete an experiment for good (admins): Conflict while it has runs (delete them
    first, newest first: `DELETE /runs/{id}`). Audit-logged (`experiment.delete`)."""
    experiment = get_experiment(db, experiment_id)
    runs = db.scalars(
        select(Run.id).where(Run.experiment_id == experiment.id).order_by(Run.id.desc()).limit(5)
    ).all()
    if runs:
        raise Conflict(
            f"experiment {experiment_id} still has runs ({', '.join(map(str, runs))}): delete "
            "them first (repro delete), or archive the experiment"
        )
    details = {"name": experiment.name, "spec_hash": experiment.spec_hash}
    db.execute(delete(ExperimentParam).where(ExperimentParam.experiment_id == experiment.id))
    db.delete(experiment)
    audit(db=db, actor=actor, action="experiment.delete", target_type="experiment",
          target_id=experiment_id, details=details)  # fmt: skip
    db.commit()
