"""What people say of a run: its name, notes and tags (`PATCH /runs/{id}`), and whether it
is archived; every change audit-logged.

A run's tags are kept in order on the run (`runs.tags`, read with a page of runs) and one
row each in `run_tags` (read by the runs list's `tag` filter through its index); this
module is the only writer of both, so they never disagree.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import delete
from sqlalchemy.orm import Session

from service.auth.tokens import Principal, audit
from service.errors import Conflict, InvalidSpec
from service.persistence.models import TERMINAL_STATUSES, Run, RunTag, utcnow
from service.runs.experiments import get_run
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
