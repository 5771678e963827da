"""The job's log on the run page: its last lines, swapped in every 2 s while the run trains,
and the whole kept log as text."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from fastapi.responses import HTMLResponse, PlainTextResponse
from sqlalchemy.orm import Session

from service.api.deps import IdPath, ReadSessionDep
from service.dashboard.runs_page import MAX_POLLS, PollCount
from service.dashboard.web import SECURITY_HEADERS, PageRoute, ViewerDep, render
from service.persistence.models import Run
from service.runs import experiments as svc
from service.runs import logs
from service.schemas import MAX_ID

router = APIRouter(route_class=PageRoute)

TAIL_LINES = 300  # lines the page shows; the rest is a link away
Attempt = Annotated[int | None, Query(ge=1, le=MAX_ID)]


def log_context(db: Session, run: Run, attempt: int | None = None) -> dict[str, Any]:
    """The log box of the run page: the attempt's last TAIL_LINES lines."""
    view = logs.read(db, run.id, attempt=attempt)
    lines = view.text.splitlines()
    return {
        "log": view,
        "log_tail": "\n".join(lines[-TAIL_LINES:]),
        "log_hidden": max(len(lines) - TAIL_LINES, 0),
        "log_running": run.status in ("queued", "running"),
    }


@router.get("/runs/{run_id}/log/live", response_class=HTMLResponse)
def log_live(
    request: Request, run_id: IdPath, viewer: ViewerDep, db: ReadSessionDep, n: PollCount = 0
) -> HTMLResponse:
    """The log box again, with what the worker has sent since; polling stops when the run
    has ended (after one last swap, with the lines sent before the report)."""
    run = svc.get_run(db, run_id)
    return render(
        request, "run_log.html", viewer, run=run, n=n + 1, max_polls=MAX_POLLS,
        **log_context(db, run),
    )  # fmt: skip


@router.get("/runs/{run_id}/log.txt", response_class=PlainTextResponse)
def log_text(
    run_id: IdPath, viewer: ViewerDep, db: ReadSessionDep, attempt: Attempt = None
) -> PlainTextResponse:
    """The whole kept log of an attempt (the latest by default), as text."""
    run = svc.get_run(db, run_id)
    view = logs.read(db, run.id, attempt=attempt)
    head = f"[the first {view.dropped} bytes of this log are no longer kept]\n"
    return PlainTextResponse((head if view.dropped else "") + view.text, headers=SECURITY_HEADERS)
