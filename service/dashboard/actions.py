"""Dashboard actions (rerun, cancel, audit, refine): POST forms, submitter role and a CSRF
token, then a redirect (303) to the page that shows the result."""

from __future__ import annotations

from collections.abc import Callable

from fastapi import Request
from fastapi.responses import RedirectResponse
from sqlalchemy.orm import Session
from starlette.concurrency import run_in_threadpool

from service.dashboard.session import Viewer, read_form, require_submit, sessions_of

Action = Callable[[Session, Viewer, dict[str, str]], str]


async def perform(request: Request, action: Action) -> RedirectResponse:
    """Check who acts and their CSRF token, run `action`, and go where it says."""
    form = await read_form(request)
    sessions = sessions_of(request)

    def work() -> str:
        with request.app.state.sessionmaker() as db:
            viewer = sessions.viewer(request, db)
            require_submit(viewer)
            sessions.check_csrf(viewer, form)
            return action(db, viewer, form)

    target = await run_in_threadpool(work)
    return RedirectResponse(target, status_code=303)
