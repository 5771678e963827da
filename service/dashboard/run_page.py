"""The run page (`/runs/{id}`): grouped provenance, seed ledger, hazards, the trace against
the family reference, curves, live progress, error, artifacts; Rerun, Cancel, Audit."""

from __future__ import annotations

import re
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from pydantic import ValidationError
from sqlalchemy import select
from sqlalchemy.orm import Session

from service.api.deps import IdPath, ReadSessionDep
from service.config import Settings
from service.dashboard import charts, log_view, models_page, provenance_view, run_rows
from service.dashboard.actions import perform
from service.dashboard.runs_page import MAX_POLLS, PollCount
from service.dashboard.session import Viewer
from service.dashboard.web import PageRoute, ViewerDep, finite, render, svg
from service.errors import Conflict, MalformedBody, NotFound
from service.persistence.models import Artifact, Verdict, Worker
from service.runs import experiments as svc
from service.runs import labels
from service.schemas import MAX_AUDIT_COPIES, RunEdit
from service.storage import artifacts, blob_store
from service.verification import spot_checks
from worker.compare.spec_diff import flatten_spec
from worker.errors import SpecError
from worker.models import registry
from worker.spec import ScriptExperimentSpec, parse_any_spec

router = APIRouter(route_class=PageRoute)


# What a page says it shows (see `state`): letters, digits and dashes.
ShownState = Annotated[str, Query(max_length=80, pattern=r"^[a-z0-9-]*$")]


def epochs_done(progress: dict[str, Any], epochs: int) -> float:
    """Epochs done as of the worker's latest progress event, counting a part-done epoch."""
    epoch = finite(progress.get("epoch")) or 0.0
    event = progress.get("event")
    if event == "finished" and progress.get("status") == "succeeded":
        return float(epochs)  # trained; the worker is reporting the result
    if event == "epoch_start":
        epoch -= 1
    elif event == "step":  # inside `epoch`: its batches so far count as part of it
        batch, batches = finite(progress.get("batch")), finite(progress.get("batches"))
        share = batch / batches if batch is not None and batches else 0.0
        epoch -= 1 - min(max(share, 0.0), 1.0)
    return min(max(epoch, 0.0), float(epochs))


def live_context(db: Session, run_id: int) -> dict[str, Any]:
    """What the live part of the run page shows: status, progress, fingerprint, verdict."""
    run = svc.get_run(db, run_id)
    [row] = run_rows.rows_of(db, [(run, run.experiment)])
    progress = run.progress if isinstance(run.progress, dict) else {}
    epochs = int(run.experiment.spec.get("training", {}).get("epochs") or 0)
    running = run.status == "running"
    bar = charts.progress_bar(epochs_done(progress, epochs), epochs) if running else ""
    return {
        "row": row,
        "run": run,
        "progress": progress,
        "epochs": epochs,
        "bar": svg(bar),
        "max_polls": MAX_POLLS,
        "state": state(run.status, row.badge.kind, run.attempt),
    }


def state(status: str, badge: str | None, attempt: int) -> str:
    """What changes the whole page rather than its live strip: the status, the verdict badge
    (a finished run's may settle later), the attempt (a retry clears the last one's record)."""
    return f"{status}-{badge or 'none'}-{attempt}"


def page_context(db: Session, live: dict[str, Any], settings: Settings) -> dict[str, Any]:
    """Everything the run page shows, around what its live part shows (`live_context`)."""
    run = live["run"]
    files = db.scalars(
        select(Artifact).where(Artifact.run_id == run.id).order_by(Artifact.kind, Artifact.id)
    ).all()
    return {
        **live,
        **provenance_view.provenance_context(db=db, run=run),
        "worker": db.get(Worker, run.worker_id) if run.worker_id is not None else None,
        "verdict": db.scalar(select(Verdict).where(Verdict.run_id == run.id)),
        "files": files,
        "max_copies": MAX_AUDIT_COPIES,
        "model": models_page.model_of(db, run.experiment),
        "spot_checks": spot_checks.shown_for(db, run.id),
        "max_segments": settings.max_spot_check_segments,
        "final_metrics": _final_metrics(run.metrics),
        "hyperparameters": _hyperparameters(run.experiment.spec),
        **log_view.log_context(db, run),
    }


# Spec fields the summary leaves to the sections that show them (seed ledger, data, code).
_NOT_HYPERPARAMETERS = ("name", "seed", "kind", "code", "dataset.data", "model.definition")


def _final_metrics(metrics: list[Any] | None) -> list[tuple[str, Any]]:
    """The last epoch's metrics, for the summary: (name, value), the counters left out."""
    rows = [r for r in metrics or [] if isinstance(r, dict)]
    if not rows:
        return []
    last = rows[-1]
    shown = [("epoch", last.get("epoch"))] if last.get("epoch") is not None else []
    return shown + [
        (name, value)
        for name, value in last.items()
        if name not in ("epoch", "step", "seconds") and isinstance(value, int | float)
    ]


def _hyperparameters(spec: dict[str, Any]) -> list[tuple[str, Any]]:
    """The spec's fields by dotted path, as a search names them (`params.PATH`)."""
    return [
        (path, value)
        for path, value in flatten_spec(spec).items()
        if not any(path == n or path.startswith(f"{n}.") for n in _NOT_HYPERPARAMETERS)
    ]


@router.get("/runs/{run_id}", response_class=HTMLResponse)
def run_page(
    request: Request, run_id: IdPath, viewer: ViewerDep, db: ReadSessionDep
) -> HTMLResponse:
    """Everything recorded about one run."""
    context = page_context(db, live_context(db, run_id), request.app.state.settings)
    return render(request, "run.html", viewer, **context)


@router.get("/runs/{run_id}/live", response_class=HTMLResponse)
def run_live(
    request: Request,
    run_id: IdPath,
    viewer: ViewerDep,
    db: ReadSessionDep,
    n: PollCount = 0,
    shown: ShownState = "",
) -> HTMLResponse:
    """The live part of the run page; polling stops once the run and its badge are final.

    When the page shows another state than the run's (it started, finished, got its verdict)
    the answer is the whole page content, swapped into <main>: the summary, trace, curves
    and actions change with the state, not only the live strip.
    """
    live = live_context(db, run_id)
    if shown and shown != live["state"]:
        return render(
            request,
            "run_main.html",
            viewer,
            headers={"HX-Retarget": "main", "HX-Reswap": "innerHTML"},
            n=n + 1,
            **page_context(db, live, request.app.state.settings),
        )
    return render(request, "run_live.html", viewer, live_refresh=True, n=n + 1, **live)


@router.get("/runs/{run_id}/artifacts/{artifact_id}")
def download(
    run_id: IdPath, artifact_id: IdPath, viewer: ViewerDep, db: ReadSessionDep
) -> Response:
    """An artifact's bytes, for a logged-in viewer (the API wants a bearer token)."""
    art = artifacts.get_artifact(db, artifact_id)
    if art.run_id != run_id:
        raise NotFound(f"run {run_id} has no artifact {artifact_id}")
    return blob_store.download_response(art.storage_url, sha256=art.sha256, filename=art.name)


@router.post("/runs/{run_id}/rerun")
async def rerun(request: Request, run_id: IdPath) -> RedirectResponse:
    """Queue a rerun and open its page."""

    def act(db: Session, viewer: Viewer, form: dict[str, str]) -> str:
        new = svc.rerun(
            db=db, run_id=run_id, actor=viewer.principal, settings=request.app.state.settings
        )
        return f"/runs/{new.id}"

    return await perform(request, act)


@router.post("/runs/{run_id}/cancel")
async def cancel(request: Request, run_id: IdPath) -> RedirectResponse:
    """Cancel a queued or running run."""

    def act(db: Session, viewer: Viewer, form: dict[str, str]) -> str:
        svc.cancel(db=db, run_id=run_id, actor=viewer.principal)
        return f"/runs/{run_id}"

    return await perform(request, act)


@router.post("/runs/{run_id}/labels")
async def edit_labels(request: Request, run_id: IdPath) -> RedirectResponse:
    """Set the run's name, notes and tags (comma- or space-separated) from its page."""

    def act(db: Session, viewer: Viewer, form: dict[str, str]) -> str:
        fields: dict[str, Any] = {k: form[k] for k in ("name", "notes") if k in form}
        if "tags" in form:
            fields["tags"] = [t for t in re.split(r"[\s,]+", form["tags"]) if t]
        try:
            change = RunEdit.model_validate(fields)
        except ValidationError as exc:
            problem = exc.errors()[0]
            where = ".".join(str(p) for p in problem["loc"])
            raise MalformedBody(f"{where}: {problem['msg']}") from None
        labels.edit(db=db, run_id=run_id, change=change, actor=viewer.principal)
        return f"/runs/{run_id}"

    return await perform(request, act)


@router.post("/runs/{run_id}/archive")
async def archive(request: Request, run_id: IdPath) -> RedirectResponse:
    """Archive an ended run: the runs list leaves it out unless asked."""

    def act(db: Session, viewer: Viewer, form: dict[str, str]) -> str:
        labels.archive(db=db, run_id=run_id, archived=True, actor=viewer.principal)
        return f"/runs/{run_id}"

    return await perform(request, act)


@router.post("/runs/{run_id}/unarchive")
async def unarchive(request: Request, run_id: IdPath) -> RedirectResponse:
    """Bring an archived run back into the runs list."""

    def act(db: Session, viewer: Viewer, form: dict[str, str]) -> str:
        labels.archive(db=db, run_id=run_id, archived=False, actor=viewer.principal)
        return f"/runs/{run_id}"

    return await perform(request, act)


@router.post("/runs/{run_id}/spot-check")
async def spot_check(request: Request, run_id: IdPath) -> RedirectResponse:
    """Replay random segments of the run from its checkpoints; back to its spot checks."""

    def act(db: Session, viewer: Viewer, form: dict[str, str]) -> str:
        text = form.get("segments", "")
        if not text.isdigit():
            raise MalformedBody("segments must be a whole number")
        spot_checks.request_spot_check(
            db=db,
            run_id=run_id,
            segments=int(text),
            settings=request.app.state.settings,
            actor=viewer.principal,
        )
        return f"/runs/{run_id}#spot-checks"

    return await perform(request, act)


@router.post("/runs/{run_id}/audit")
async def audit(request: Request, run_id: IdPath) -> RedirectResponse:
    """Run the run's experiment N times at once on different workers; open the audit."""

    def act(db: Session, viewer: Viewer, form: dict[str, str]) -> str:
        text = form.get("copies", "")
        if not text.isdigit() or not 2 <= int(text) <= MAX_AUDIT_COPIES:
            raise MalformedBody(f"copies must be a whole number from 2 to {MAX_AUDIT_COPIES}")
        run = svc.get_run(db, run_id)
        settings = request.app.state.settings
        try:
            spec = parse_any_spec(run.experiment.spec)
            if isinstance(spec, ScriptExperimentSpec):
                svc.check_script(db, spec, settings)
            else:  # a code bundle's components are known only within its context
                with svc.code_components(db, spec, settings):
                    registry.check_spec(spec)
        except (SpecError, ValueError) as exc:
            raise Conflict(f"the experiment of run {run_id} no longer validates: {exc}") from None
        _, first, _ = svc.create_experiment(
            db=db, spec=spec, actor=viewer.principal, copies=int(text), settings=settings
        )
        return f"/audits/{first.audit_id}"

    return await perform(request, act)
