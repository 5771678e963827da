"""The compare page (`/compare?a=&b=`): verdict, the divergence map, variable sizes, data
or compute, the environment and spec diffs, both curves, and Refine to the step."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from fastapi.responses import HTMLResponse, RedirectResponse
from sqlalchemy.orm import Session

from service.api.deps import SessionDep
from service.dashboard import charts, provenance_view
from service.dashboard.actions import perform
from service.dashboard.charts import MapCell
from service.dashboard.session import Viewer
from service.dashboard.web import PageRoute, ViewerDep, render, svg
from service.errors import MalformedBody
from service.persistence.models import Run
from service.runs import experiments as svc
from service.schemas import MAX_ID, ComparisonReport
from service.verification import comparisons
from service.verification.verdicts import trace_of

router = APIRouter(route_class=PageRoute)
RunId = Annotated[int, Query(ge=1, le=MAX_ID)]
EQUAL, MISSING = MapCell("equal"), MapCell("missing")


def _point_key(p: Mapping[str, Any]) -> tuple[str, int, int]:
    return (str(p["kind"]), int(p["epoch"]), int(p["step"]))


def _label(key: tuple[str, int, int]) -> str:
    kind, epoch, step = key
    return "init" if kind == "init" else f"e{epoch}" if kind == "epoch" else f"e{epoch}/s{step}"


def divergence_map(
    report: ComparisonReport,
    trace_a: Sequence[Mapping[str, Any]],
    trace_b: Sequence[Mapping[str, Any]],
) -> tuple[str, list[str]]:
    """The SVG map and its variables in model order ('' when the traces share no point)."""
    b_points = {_point_key(p): p for p in trace_b}
    shared = [(p, b_points[_point_key(p)]) for p in trace_a if _point_key(p) in b_points]
    if not shared:
        return "", []
    order: dict[str, None] = {}  # model order, first seen first; a dict keeps it in O(1)
    for a, b in shared:
        order.update(dict.fromkeys(a["variables"]))
        order.update(dict.fromkeys(b["variables"]))
    variables = list(order)
    ulps: dict[str, int | None] = {d.variable: d.max_ulp for d in report.differences}
    measured = report.differences_measured_at
    first = report.first_divergence
    first_key = (first.kind, first.epoch, first.step) if first else None
    points = [(a["variables"], b["variables"], _point_key(a)) for a, b in shared]
    measured_at = [
        measured is not None and key[0] == "epoch" and key[1] == measured.epoch
        for _, _, key in points
    ]
    cells: list[list[MapCell]] = []
    for name in variables:
        row = []
        for (va, vb, key), at_measure in zip(points, measured_at, strict=True):
            da, db_ = va.get(name), vb.get(name)
            if da == db_ and da is not None:
                row.append(EQUAL)
            elif da is None or db_ is None:
                row.append(MISSING)
            else:
                row.append(
                    MapCell("differs", ulps.get(name) if at_measure else None, key == first_key)
                )
        cells.append(row)
    columns = [_label(_point_key(a)) for a, _ in shared]
    return charts.divergence_map(variables, columns, cells), variables


def environment_rows(
    a: Run, b: Run, report: ComparisonReport, show_all: bool
) -> list[dict[str, Any]]:
    """Environment fields of both runs: differing bit-affecting ones first; identical ones
    only when asked for."""
    rows = [
        {"field": d.field, "a": d.a, "b": d.b, "breaking": d.breaks_reproducibility,
         "why": d.why, "same": False}
        for d in sorted(report.provenance_diff, key=lambda d: not d.breaks_reproducibility)
    ]  # fmt: skip
    if show_all:
        listed = {r["field"] for r in rows}
        flat_a = provenance_view.flatten(a.provenance or {})
        flat_b = provenance_view.flatten(b.provenance or {})
        for field in sorted(set(flat_a) | set(flat_b)):
            if field not in listed:
                same = flat_a.get(field) == flat_b.get(field)
                rows.append({"field": field, "a": flat_a.get(field), "b": flat_b.get(field),
                             "breaking": False, "why": None, "same": same})  # fmt: skip
    return rows


def spec_diff(a: Run, b: Run) -> list[tuple[str, Any, Any]]:
    """The spec fields that differ between the two runs' experiments."""
    if a.experiment.spec_hash == b.experiment.spec_hash:
        return []
    flat_a = provenance_view.flatten(a.experiment.spec)
    flat_b = provenance_view.flatten(b.experiment.spec)
    return [
        (k, flat_a.get(k), flat_b.get(k))
        for k in sorted(set(flat_a) | set(flat_b))
        if flat_a.get(k) != flat_b.get(k)
    ]


def overlaid_curves(a: Run, b: Run) -> list[charts.Chart]:
    names = provenance_view.metric_names(a.metrics)
    names += [n for n in provenance_view.metric_names(b.metrics) if n not in names]
    names.sort(key=lambda n: (n != "loss", n))
    drawn = [
        charts.chart(
            [
                provenance_view.series(a.metrics, name, f"run {a.id}"),
                provenance_view.series(b.metrics, name, f"run {b.id}", dashed=True),
            ],
            title=name,
        )
        for name in names
    ]
    return [d for d in drawn if d is not None]


@router.get("/compare", response_class=HTMLResponse)
def compare_page(
    request: Request,
    viewer: ViewerDep,
    db: SessionDep,
    a: RunId,
    b: RunId,
    env: Annotated[str, Query(max_length=10)] = "",
    refinement: Annotated[int | None, Query(ge=1, le=MAX_ID)] = None,
) -> HTMLResponse:
    """Run b against run a, drawn."""
    run_a, run_b = svc.get_run(db, a), svc.get_run(db, b)
    settings = request.app.state.settings
    found = comparisons.compare_ids(
        db,
        a,
        b,
        max_checkpoint_bytes=settings.max_checkpoint_bytes,
        max_stored=settings.max_stored_comparisons,
    )
    report = ComparisonReport.model_validate(found)
    trace_a, trace_b = trace_of(db, a), trace_of(db, b)
    drawn, variables = divergence_map(report, trace_a, trace_b)
    refined = (
        comparisons.refinement_view(db, comparisons.get_refinement(db, refinement))
        if refinement
        else None
    )
    return render(
        request,
        "compare.html",
        viewer,
        a=run_a,
        b=run_b,
        report=report,
        map=svg(drawn),
        map_variables=variables,
        environment=environment_rows(run_a, run_b, report, env == "all"),
        show_all_env=env == "all",
        spec_diff=spec_diff(run_a, run_b),
        curves=overlaid_curves(run_a, run_b),
        refinement=refined,
        # Refining replays an epoch step by step: nothing to refine where the runs differ
        # before any step (initial weights) or only because their seeds differ.
        can_refine=report.verdict == "diverged"
        and run_a.kind == run_b.kind == "train"
        and report.first_divergence is not None
        and report.first_divergence.kind != "init"
        and report.cause != "seed",
    )


@router.post("/compare/refine")
async def refine(request: Request) -> RedirectResponse:
    """Re-trace the divergent epoch step by step; back to the comparison, which shows it."""

    def act(db: Session, viewer: Viewer, form: dict[str, str]) -> str:
        try:
            a, b = int(form.get("a", "")), int(form.get("b", ""))
        except ValueError:
            raise MalformedBody("a and b must be run ids") from None
        if not (1 <= a <= MAX_ID and 1 <= b <= MAX_ID):
            raise MalformedBody("a and b must be run ids")
        found = comparisons.create_refinement(
            db=db, a_id=a, b_id=b, actor=viewer.principal, settings=request.app.state.settings
        )
        return f"/compare?a={a}&b={b}&refinement={found.id}"

    return await perform(request, act)
