"""The certificate of a run (`/runs/{id}/certificate`): one self-contained HTML file with
its spec, seed, provenance, trace, verdict and family: inline CSS and SVG, no scripts, no
other file, so an auditor can archive it or attach it to a paper."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse
from sqlalchemy import select

from service.api.deps import IdPath, ReadSessionDep
from service.dashboard import provenance_view, run_rows
from service.dashboard.experiment_page import family_view, spec_yaml
from service.dashboard.web import PageRoute, ViewerDep, render
from service.persistence.models import Run, Verdict, utcnow
from service.runs import experiments as svc
from service.verification import spot_checks

router = APIRouter(route_class=PageRoute)
MAX_FAMILY = 200
# Only the page's own inline style applies: nothing loads, nothing runs.
CERTIFICATE_CSP = (
    "default-src 'none'; style-src 'unsafe-inline'; img-src data:; base-uri 'none'; "
    "form-action 'none'; frame-ancestors 'none'"
)


@router.get("/runs/{run_id}/certificate", response_class=HTMLResponse)
def certificate(
    request: Request, run_id: IdPath, viewer: ViewerDep, db: ReadSessionDep
) -> HTMLResponse:
    """The run's reproducibility certificate."""
    run = svc.get_run(db, run_id)
    [row] = run_rows.rows_of(db, [(run, run.experiment)])
    family = db.scalars(
        select(Run)
        .where(Run.family_id == (run.family_id or run.id), Run.kind == "train")
        .order_by(Run.id)
        .limit(MAX_FAMILY)
    ).all()
    family_rows = run_rows.rows_of(db, [(r, r.experiment) for r in family])
    verdict = db.scalar(select(Verdict).where(Verdict.run_id == run.id))
    return render(
        request,
        "certificate.html",
        viewer,
        headers={
            "Content-Security-Policy": CERTIFICATE_CSP,
            "Content-Disposition": f'inline; filename="run-{run.id}-certificate.html"',
        },
        run=run,
        row=row,
        verdict=verdict,
        spot_checks=spot_checks.shown_for(db, run.id),
        **provenance_view.provenance_context(db=db, run=run),
        spec_text=spec_yaml(run.experiment.spec),
        family=family_rows,
        tree=family_view(db, family)["tree"],
        issued=utcnow(),
        origin=str(request.base_url).rstrip("/"),
    )
