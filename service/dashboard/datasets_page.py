"""The datasets pages: every pushed dataset a page at a time (`/datasets`), and one
dataset's arrays with the experiments and runs that trained on it (`/datasets/{digest}`)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse

from service.api.deps import ReadSessionDep
from service.dashboard.by_digest_pages import (
    Cursor,
    DigestPath,
    add_archive_actions,
    list_page,
    users_of,
)
from service.dashboard.web import PageRoute, ViewerDep, render
from service.storage import datasets

router = APIRouter(route_class=PageRoute)


@router.get("/datasets", response_class=HTMLResponse)
def datasets_page(
    request: Request,
    viewer: ViewerDep,
    db: ReadSessionDep,
    before: Cursor = None,
    after: Cursor = None,
    archived: bool = False,
) -> HTMLResponse:
    """Pushed datasets, newest first."""
    return list_page(
        request,
        viewer,
        db,
        datasets.STORE,
        path="/datasets",
        template="datasets.html",
        items="datasets",
        before=before,
        after=after,
        archived=archived,
    )


@router.get("/datasets/{digest}", response_class=HTMLResponse)
def dataset_page(
    request: Request, digest: DigestPath, viewer: ViewerDep, db: ReadSessionDep
) -> HTMLResponse:
    """One dataset: what it holds, who pushed it, and what trained on it."""
    dataset = datasets.get(db, digest)
    users = users_of(db, datasets.STORE.uses(dataset.digest))
    return render(request, "dataset.html", viewer, dataset=dataset, **users)


add_archive_actions(router, datasets.STORE, path="/datasets")
