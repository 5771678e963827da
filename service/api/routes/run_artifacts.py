"""A run's artifacts: checkpoints, the exported model, logs, each with its download URL."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query
from sqlalchemy import select

from service.api.deps import IdPath, ReadAccess, ReadSessionDep
from service.api.responses import errors
from service.api.routing import JsonRoute
from service.persistence.models import Artifact
from service.runs import experiments as svc
from service.runs import logs
from service.schemas import MAX_ID, RunArtifact, RunLogOut

router = APIRouter(prefix="/runs", tags=["runs"], route_class=JsonRoute)


@router.get("/{run_id}/artifacts", response_model=list[RunArtifact], responses=errors(404, 422))
def list_artifacts(run_id: IdPath, db: ReadSessionDep, _: ReadAccess) -> list[RunArtifact]:
    """The files uploaded for a run, by kind: `model` (the final model in Keras's `.keras`
    format, for a succeeded run), `checkpoint`, `weights`, `log`."""
    run = svc.get_run(db, run_id)
    rows = db.scalars(
        select(Artifact).where(Artifact.run_id == run.id).order_by(Artifact.kind, Artifact.id)
    )
    return [
        RunArtifact(
            id=a.id,
            run_id=a.run_id,
            kind=a.kind,
            name=a.name,
            epoch=a.epoch,
            sha256=a.sha256,
            size=a.size,
            created_at=a.created_at,
            download_url=f"/api/v1/artifacts/{a.id}",
        )
        for a in rows
    ]


@router.get("/{run_id}/log", response_model=RunLogOut, responses=errors(404, 422))
def run_log(
    run_id: IdPath,
    db: ReadSessionDep,
    _: ReadAccess,
    attempt: Annotated[int | None, Query(ge=1, le=MAX_ID)] = None,
    after: Annotated[int, Query(ge=0, le=2**62)] = 0,
) -> RunLogOut:
    """The job's log of an attempt (the latest by default) from byte `after`, as the worker
    sent it with its heartbeats: live while the run trains, kept after it ends (the last
    `REPRO_MAX_LOG_BYTES` of each attempt)."""
    run = svc.get_run(db, run_id)
    view = logs.read(db, run.id, attempt=attempt, after=after)
    return RunLogOut(
        run_id=run.id,
        attempt=view.attempt,
        attempts=view.attempts,
        start=view.start,
        end=view.end,
        dropped=view.dropped,
        text=view.text,
        running=run.status in ("queued", "running"),
    )
