"""The projects list (`/projects`): experiments grouped by name. Each seed or learning rate
of a spec is an experiment of its own (its hash differs); under one name they are one
project, with its runs, how its reruns came out, a link to its runs and one comparing the
latest succeeded run of each of its experiments."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Annotated
from urllib.parse import urlencode

from fastapi import APIRouter, Query, Request
from fastapi.responses import HTMLResponse
from sqlalchemy import case, func, select
from sqlalchemy.orm import Session

from service.api.deps import ReadSessionDep
from service.dashboard.experiments_page import contains_pattern
from service.dashboard.web import PageRoute, ViewerDep, render
from service.persistence.models import Experiment, Run, Verdict

router = APIRouter(route_class=PageRoute)
PAGE_SIZE = 50
Name = Annotated[str, Query(max_length=200)]


@dataclass
class ProjectRow:
    """One line of the projects list."""

    name: str
    experiments: int
    runs: int = 0
    succeeded: int = 0
    latest_run: int | None = None
    verdicts: Counter[str] = field(default_factory=Counter)
    compare: list[int] = field(default_factory=list)  # the latest succeeded run of each

    @property
    def runs_url(self) -> str:
        quoted = "'" + self.name.replace("\\", "\\\\").replace("'", "\\'") + "'"
        return "/?" + urlencode({"search": f"experiment = {quoted}"})

    @property
    def compare_url(self) -> str:
        return "/compare/runs?" + urlencode([("runs", r) for r in self.compare])


def project_rows(db: Session, names: list[str], max_compare: int) -> list[ProjectRow]:
    """The rows of these names, in a fixed number of queries; archived experiments (and
    their runs) left out."""
    shown = Experiment.name.in_(names) & Experiment.archived_at.is_(None)
    counts = db.execute(
        select(Experiment.name, func.count(Experiment.id)).where(shown).group_by(Experiment.name)
    )
    rows = {name: ProjectRow(name, count) for name, count in counts}
    trained = (
        select(
            Experiment.name,
            func.count(Run.id),
            func.sum(case((Run.status == "succeeded", 1), else_=0)),
            func.max(Run.id),
        )
        .join(Run, Run.experiment_id == Experiment.id)
        .where(shown, Run.kind == "train")
        .group_by(Experiment.name)
    )
    for name, runs, succeeded, latest in db.execute(trained):
        row = rows[name]
        row.runs, row.succeeded, row.latest_run = runs, int(succeeded or 0), latest
    judged = (
        select(Experiment.name, Verdict.verdict, func.count(Verdict.id))
        .join(Run, Run.experiment_id == Experiment.id)
        .join(Verdict, Verdict.run_id == Run.id)
        .where(shown)
        .group_by(Experiment.name, Verdict.verdict)
    )
    for name, verdict, count in db.execute(judged):
        rows[name].verdicts[verdict] = count
    newest = (
        select(Experiment.name, func.max(Run.id))
        .join(Run, Run.experiment_id == Experiment.id)
        .where(shown, Run.kind == "train", Run.status == "succeeded")
        .group_by(Experiment.name, Experiment.id)
    )
    for name, run_id in db.execute(newest):
        rows[name].compare.append(run_id)
    for row in rows.values():
        row.compare = sorted(row.compare, reverse=True)[:max_compare]
    return [rows[n] for n in names if n in rows]


def _url(name: str, after: str | None = None) -> str:
    items = [("name", name)] if name else []
    items += [("after", after)] if after is not None else []
    return "/projects?" + urlencode(items) if items else "/projects"


@router.get("/projects", response_class=HTMLResponse)
def projects_page(
    request: Request,
    viewer: ViewerDep,
    db: ReadSessionDep,
    name: Name = "",
    after: Annotated[str | None, Query(max_length=200)] = None,
) -> HTMLResponse:
    """Projects by name, A to Z, optionally those whose name contains `name`; a page of
    names at a time, walked on the name index. Archived experiments are left out."""
    name = name.strip()
    query = (
        select(Experiment.name)
        .where(Experiment.archived_at.is_(None))
        .group_by(Experiment.name)
        .order_by(Experiment.name)
    )
    if name:
        query = query.where(Experiment.name.ilike(contains_pattern(name), escape="\\"))
    if after is not None:
        query = query.where(Experiment.name > after)
    names = list(db.scalars(query.limit(PAGE_SIZE + 1)))
    more, names = len(names) > PAGE_SIZE, names[:PAGE_SIZE]
    settings = request.app.state.settings
    return render(
        request,
        "projects.html",
        viewer,
        rows=project_rows(db, names, settings.max_compare_runs),
        name=name,
        next_url=_url(name, names[-1]) if more else None,
        first_url=_url(name) if after is not None else None,
    )
