"""The workers page (`/workers`): each worker, what it can run, when it was last seen and
the run it holds, a page at a time."""

from __future__ import annotations

from typing import Annotated
from urllib.parse import urlencode

from fastapi import APIRouter, Query, Request
from fastapi.responses import HTMLResponse
from pydantic import AfterValidator
from sqlalchemy import select

from service.api.deps import ReadSessionDep
from service.dashboard.web import PageRoute, ViewerDep, render
from service.persistence.models import Run, utcnow
from service.runs import worker_list

router = APIRouter(route_class=PageRoute)
PAGE_SIZE = 50  # a worker row lists its images: a page stays a few hundred KB at most

Cursor = Annotated[
    str | None,
    Query(max_length=worker_list.MAX_CURSOR_CHARS),
    AfterValidator(worker_list.checked_cursor),
]


@router.get("/workers", response_class=HTMLResponse)
def workers_page(
    request: Request, viewer: ViewerDep, db: ReadSessionDep, cursor: Cursor = None
) -> HTMLResponse:
    """Workers, most recently seen first."""
    page = worker_list.workers_page(db, limit=PAGE_SIZE, cursor=cursor)
    ids = [w.id for w in page.workers]
    held = db.execute(
        select(Run.worker_id, Run.id).where(Run.status == "running", Run.worker_id.in_(ids))
    )
    current: dict[int, list[int]] = {}
    for worker_id, run_id in held:
        if worker_id is not None:
            current.setdefault(worker_id, []).append(run_id)
    return render(
        request,
        "workers.html",
        viewer,
        workers=page.workers,
        current=current,
        now=utcnow(),
        first_url="/workers" if cursor is not None else None,
        older_url=(
            f"/workers?{urlencode({'cursor': page.next_cursor})}" if page.next_cursor else None
        ),
    )
