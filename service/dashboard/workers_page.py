"""The workers page (`/workers`): each worker, what it can run, when it was last seen and
the run it holds."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse
from sqlalchemy import select

from service.api.deps import ReadSessionDep
from service.dashboard.web import PageRoute, ViewerDep, render
from service.persistence.models import Run, Worker, utcnow

router = APIRouter(route_class=PageRoute)
MAX_WORKERS = 1000


@router.get("/workers", response_class=HTMLResponse)
def workers_page(request: Request, viewer: ViewerDep, db: ReadSessionDep) -> HTMLResponse:
    """Workers, most recently seen first."""
    workers = db.scalars(
        select(Worker).order_by(Worker.last_seen_at.desc()).limit(MAX_WORKERS)
    ).all()
    ids = [w.id for w in workers]
    held = db.execute(
        select(Run.worker_id, Run.id).where(Run.status == "running", Run.worker_id.in_(ids))
    )
    current: dict[int, list[int]] = {}
    for worker_id, run_id in held:
        if worker_id is not None:
            current.setdefault(worker_id, []).append(run_id)
    return render(request, "workers.html", viewer, workers=workers, current=current, now=utcnow())
