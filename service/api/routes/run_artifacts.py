"""A run's artifacts: checkpoints, the exported model, logs, each with its download URL."""

from __future__ import annotations

from fastapi import APIRouter
from sqlalchemy import select

from service.api.deps import IdPath, ReadAccess, ReadSessionDep
from service.api.responses import errors
from service.api.routing import JsonRoute
from service.persistence.models import Artifact
from service.runs import experiments as svc
from service.schemas import RunArtifact

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
