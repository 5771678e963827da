"""The web dashboard of provenance: server-rendered pages over the service's records.

Each page has its module here and its templates under `templates/`; the files under
`static/` are served from the package (htmx 2.0.11 from npm, unmodified, 0BSD licence in
`static/htmx.LICENSE.txt`; uPlot 1.6.32 from npm, its `dist/uPlot.iife.min.js` and
`uPlot.min.css` unmodified, MIT licence in `static/uPlot.LICENSE.txt`; the stylesheet, the
copy-button script and `charts.js` are ours).
"""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter, FastAPI
from fastapi.staticfiles import StaticFiles

from service.config import Settings

STATIC_DIR = Path(__file__).resolve().parent / "static"
ASSETS = "/static/dashboard"


def dashboard_router() -> APIRouter:
    """Every dashboard page, collected."""
    from service.dashboard import (
        audits_page,
        certificate_page,
        compare_page,
        compare_runs_page,
        datasets_page,
        experiment_page,
        experiments_page,
        log_view,
        login,
        models_page,
        projects_page,
        run_page,
        runs_page,
        workers_page,
    )

    router = APIRouter(include_in_schema=False)
    for page in (login, runs_page, run_page, compare_page, compare_runs_page, experiment_page,
                 certificate_page, audits_page, workers_page, experiments_page,
                 datasets_page, models_page, log_view, projects_page):  # fmt: skip
        router.include_router(page.router)
    return router


def install_dashboard(app: FastAPI, settings: Settings) -> None:
    """Serve the dashboard's pages and assets; creates its signing secret on first start."""
    from service.dashboard.session import Sessions, load_secret

    app.state.dashboard_sessions = Sessions(
        load_secret(settings), settings.dashboard_session_hours * 3600
    )
    app.mount(ASSETS, StaticFiles(directory=STATIC_DIR), name="dashboard-assets")
    app.include_router(dashboard_router())


def issue_login_url(app: FastAPI, base_url: str, token: str) -> str:
    """A one-time, short-lived login URL standing for `token` (for the embedded server)."""
    from service.auth.tokens import verify
    from service.dashboard.session import issue_code

    with app.state.sessionmaker() as db:
        code = issue_code(db, verify(db, token).token_id)
    return f"{base_url}/login?code={code}"
