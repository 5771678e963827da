"""The audits (`/audits`, newest first) and an audit's page (`/audits/{id}`): the N copies
of a reproducibility audit, which workers ran them, and whether they agree bitwise."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse

from service.api.deps import IdPath, ReadSessionDep
from service.dashboard.web import PageRoute, ViewerDep, render
from service.runs import audits as repro_audits

router = APIRouter(route_class=PageRoute)


AUDITS_SHOWN = 100


@router.get("/audits", response_class=HTMLResponse)
def audits_page(request: Request, viewer: ViewerDep, db: ReadSessionDep) -> HTMLResponse:
    """The newest audits: whether each one's copies agree, and on how many workers."""
    audits = repro_audits.audit_list(db, limit=AUDITS_SHOWN)
    return render(request, "audits.html", viewer, audits=audits, shown=AUDITS_SHOWN)


@router.get("/audits/{audit_id}", response_class=HTMLResponse)
def audit_page(
    request: Request, audit_id: IdPath, viewer: ViewerDep, db: ReadSessionDep
) -> HTMLResponse:
    """An audit's copies and their agreement."""
    view = repro_audits.audit_view(db, audit_id)
    live = not view["finished"]
    return render(request, "audit.html", viewer, audit=view, live=live)
