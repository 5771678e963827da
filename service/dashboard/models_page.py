"""The model definitions pages: every pushed Keras definition a page at a time (`/models`),
and one definition's layers with the experiments and runs that trained it
(`/models/{digest}`); and the layer table the run and experiment pages show."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse
from sqlalchemy.orm import Session

from service.api.deps import ReadSessionDep
from service.dashboard.by_digest_pages import (
    Cursor,
    DigestPath,
    add_archive_actions,
    list_page,
    users_of,
)
from service.dashboard.web import PageRoute, ViewerDep, render
from service.persistence.models import Experiment, ModelDefinition
from service.storage import model_definitions as definitions

router = APIRouter(route_class=PageRoute)


@router.get("/models", response_class=HTMLResponse)
def models_page(
    request: Request,
    viewer: ViewerDep,
    db: ReadSessionDep,
    before: Cursor = None,
    after: Cursor = None,
    archived: bool = False,
) -> HTMLResponse:
    """Pushed model definitions, newest first."""
    return list_page(
        request,
        viewer,
        db,
        definitions.STORE,
        path="/models",
        template="models.html",
        items="models",
        before=before,
        after=after,
        archived=archived,
    )


@router.get("/models/{digest}", response_class=HTMLResponse)
def model_page(
    request: Request, digest: DigestPath, viewer: ViewerDep, db: ReadSessionDep
) -> HTMLResponse:
    """One definition: its layers, who pushed it, and what trained it."""
    definition = definitions.get(db, digest)
    users = users_of(db, definitions.STORE.uses(definition.digest))
    return render(request, "model.html", viewer, model=definition, **users)


def model_of(db: Session, experiment: Experiment) -> ModelDefinition | None:
    """The stored definition an experiment trains, for the run and experiment pages."""
    if experiment.model_digest is None:
        return None
    return definitions.find(db, experiment.model_digest)


add_archive_actions(router, definitions.STORE, path="/models")
