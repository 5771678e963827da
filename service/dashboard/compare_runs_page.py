"""The N-way compare page (`/compare/runs?runs=1,2,3`): every pair's verdict as a matrix
linking to the two-run page, the spec and environment fields that differ among the runs
(one column per run), and their curves overlaid with a legend and values on hover."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from fastapi.responses import HTMLResponse

from service.api.deps import ReadSessionDep
from service.dashboard import charts
from service.dashboard.web import PageRoute, ViewerDep, render
from service.schemas import ManyRunsComparison
from service.verification import comparison_matrix as many_runs

router = APIRouter(route_class=PageRoute)


def matrix(found: ManyRunsComparison) -> list[list[Any]]:
    """Rows of (column run, verdict of it against the row's run), None on the diagonal."""
    by_pair = {(p.a, p.b): p for p in found.pairs}
    by_pair.update({(p.b, p.a): p for p in found.pairs})
    return [[(b, by_pair.get((a, b))) for b in found.runs] for a in found.runs]


def overlaid(curves: Mapping[str, Sequence[Any]]) -> list[charts.Chart]:
    """One chart per metric, a line per run."""
    drawn = [
        charts.chart([charts.Series(f"run {c.run}", c.points) for c in per_run], title=name)
        for name, per_run in curves.items()
    ]
    return [d for d in drawn if d is not None]


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def scatter(found: ManyRunsComparison) -> dict[str, Any] | None:
    """What the parameters-against-metrics chart draws: the numeric spec fields that differ
    (a seed by its first number) and each run's final value of each metric; None when no
    numeric field differs or nothing was measured."""
    params: dict[str, list[float | None]] = {}
    for d in found.spec_diff:
        values = [v[0] if d.field == "seed" and isinstance(v, list) and v else v for v in d.values]
        numbers = [_number(v) for v in values]
        if all(n is not None or v is None for n, v in zip(numbers, values, strict=True)) and any(
            n is not None for n in numbers
        ):
            params[d.field] = numbers
    final: dict[str, list[float | None]] = {}
    for name, per_run in found.curves.items():
        last = {c.run: c.points[-1][1] for c in per_run if c.points}
        final[name] = [_number(last.get(run)) for run in found.runs]
    if not params or not final:
        return None
    return {"runs": found.runs, "params": params, "metrics": final}


@router.get("/compare/runs", response_class=HTMLResponse)
def compare_runs_page(
    request: Request,
    viewer: ViewerDep,
    db: ReadSessionDep,
    runs: Annotated[list[str], Query()],
) -> HTMLResponse:
    """N runs, compared pairwise and overlaid."""
    settings = request.app.state.settings
    ids = many_runs.parse_run_ids(runs, max_runs=settings.max_compare_runs)
    found = ManyRunsComparison.model_validate(many_runs.compare_runs(db, run_ids=ids))
    return render(
        request,
        "compare_runs.html",
        viewer,
        found=found,
        matrix=matrix(found),
        curves=overlaid(found.curves),
        scatter=scatter(found),
    )
