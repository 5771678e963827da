"""The experiments list (`/experiments`): each experiment with its spec hash, how many runs
it has, its latest run's status and its reruns' verdicts, filtered by name, a page at a time."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Annotated
from urllib.parse import urlencode

from fastapi import APIRouter, Query, Request
from fastapi.responses import HTMLResponse
from sqlalchemy import func, select
from sqlalchemy.orm import Session, defer

from service.api.deps import ReadSessionDep
from service.dashboard.id_pages import id_page
from service.dashboard.web import PageRoute, ViewerDep, render
from service.persistence.archived import narrowed
from service.persistence.models import Experiment, Run, Verdict
from service.schemas import MAX_ID

router = APIRouter(route_class=PageRoute)
PAGE_SIZE = 50
Cursor = Annotated[int | None, Query(ge=1, le=MAX_ID)]
NameFilter = Annotated[str, Query(max_length=200)]


@dataclass
class ExperimentRow:
    """One line of the experiments list."""

    experiment: Experiment
    runs: int = 0
    latest_run: int | None = None
    latest_status: str | None = None
    verdicts: Counter[str] = field(default_factory=Counter)


def contains_pattern(text: str) -> str:
    """`text` as a LIKE pattern matching it anywhere, its wildcards taken literally."""
    escaped = text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return f"%{escaped}%"


def experiment_rows(db: Session, experiments: list[Experiment]) -> list[ExperimentRow]:
    """Rows with run counts, latest runs and verdict counts, in a fixed number of queries."""
    rows = {e.id: ExperimentRow(e) for e in experiments}
    training = select(Run.experiment_id).where(Run.experiment_id.in_(rows), Run.kind == "train")
    counted = training.add_columns(func.count(Run.id), func.max(Run.id))
    latest: dict[int, int] = {}
    for experiment_id, count, newest in db.execute(counted.group_by(Run.experiment_id)):
        rows[experiment_id].runs = count
        latest[newest] = experiment_id
    for run_id, status in db.execute(select(Run.id, Run.status).where(Run.id.in_(latest))):
        rows[latest[run_id]].latest_run, rows[latest[run_id]].latest_status = run_id, status
    judged = (
        select(Run.experiment_id, Verdict.verdict, func.count(Verdict.id))
        .join(Verdict, Verdict.run_id == Run.id)
        .where(Run.experiment_id.in_(rows))
        .group_by(Run.experiment_id, Verdict.verdict)
    )
    for experiment_id, verdict, count in db.execute(judged):
        rows[experiment_id].verdicts[verdict] = count
    return list(rows.values())


def _url(name: str, archived: bool, **cursor: int | None) -> str:
    items = [("name", name)] if name else []
    items += [("archived", "1")] if archived else []
    items += [(k, str(v)) for k, v in cursor.items() if v is not None]
    return "/experiments?" + urlencode(items) if items else "/experiments"


@router.get("/experiments", response_class=HTMLResponse)
def experiments_page(
    request: Request,
    viewer: ViewerDep,
    db: ReadSessionDep,
    name: NameFilter = "",
    before: Cursor = None,
    after: Cursor = None,
    archived: bool = False,
) -> HTMLResponse:
    """Experiments, newest first, optionally those whose name contains `name`; those not
    archived, or with `archived` only the archived ones."""
    name = name.strip()
    query = narrowed(
        select(Experiment).options(defer(Experiment.spec)),
        Experiment.archived_at,
        "true" if archived else "false",
    )
    if name:
        query = query.where(Experiment.name.ilike(contains_pattern(name), escape="\\"))
    found = id_page(db, query, Experiment.id, limit=PAGE_SIZE, before=before, after=after)
    return render(
        request,
        "experiments.html",
        viewer,
        rows=experiment_rows(db, found.items),
        name=name,
        archived=archived,
        newer_url=_url(name, archived, after=found.newer) if found.newer else None,
        older_url=_url(name, archived, before=found.older) if found.older else None,
        first_url=_url(name, archived) if before or after else None,
    )
