"""The audit page (`/audits/{id}`): the N copies of a reproducibility audit, which
workers ran them, and whether they agree bitwise."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse

from service.api.deps import IdPath, ReadSessionDep
from service.dashboard.web import PageRoute, ViewerDep, render
from service.runs import audits as repro_audits

router = APIRouter(route_class=PageRoute)


@router.get("/audits/{audit_id}", response_class=HTMLResponse)
def audit_page(
    request: Request, audit_id: IdPath, viewer: ViewerDep, db: ReadSessionDep
) -> HTMLResponse:
    """An audit's copies and their agreement."""
    view = repro_audits.audit_view(db, audit_id)
    live = not view["finished"]
    return render(request, "audit.html", viewer, audit=view, live=live)
