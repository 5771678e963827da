"""The experiment page (`/experiments/{id}`): the spec, its hash and seed, the rerun family
as a lineage tree with verdicts, the reproducibility rate, environment x verdict."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import yaml
from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, RedirectResponse
from sqlalchemy import select
from sqlalchemy.orm import Session

from service.api.deps import IdPath, ReadSessionDep
from service.dashboard import charts, models_page, run_rows
from service.dashboard.actions import perform
from service.dashboard.session import Viewer
from service.dashboard.web import PageRoute, ViewerDep, render, svg
from service.persistence.models import Experiment, Run, Verdict
from service.runs import experiments as svc
from service.runs import labels

router = APIRouter(route_class=PageRoute)
MAX_TREE = 500  # runs drawn in one lineage tree; the runs page lists the rest


def spec_yaml(spec: dict[str, Any]) -> str:
    """The spec as readable YAML, in the order it was written."""
    return yaml.safe_dump(spec, sort_keys=False, default_flow_style=False, allow_unicode=True)


def environment_key(run: Run) -> tuple[str, str, str, str]:
    """What a run ran on, as the environment x verdict table groups it."""
    p = run.provenance or {}
    libraries = p.get("libraries") or {}
    gpus = p.get("gpus") or []
    gpu = ", ".join(str(g.get("name", g)) if isinstance(g, dict) else str(g) for g in gpus)
    libs = " ".join(f"{k} {v}" for k, v in sorted(libraries.items()) if v)
    return (
        run_rows.image_of(run) or "not pinned",
        gpu or "no GPU",
        str((p.get("cpu") or {}).get("model") or "unknown CPU"),
        libs or "unknown",
    )


@dataclass
class EnvironmentRow:
    image: str
    gpu: str
    cpu: str
    libraries: str
    counts: Counter[str] = field(default_factory=Counter)


def family_view(db: Session, runs: Sequence[Run]) -> dict[str, Any]:
    """The lineage tree, the reproducibility rate and the environment table of these runs."""
    ids = [r.id for r in runs]
    found = db.execute(select(Verdict.run_id, Verdict.verdict).where(Verdict.run_id.in_(ids)))
    verdicts: dict[int, str] = {run_id: verdict for run_id, verdict in found}
    references = run_rows.references_of(db, runs)
    nodes = [
        charts.TreeNode(
            id=r.id,
            parent=r.rerun_of_id,
            label="reference" if r.id in references else r.status,
            verdict=verdicts.get(r.id),
            status=r.status,
        )
        for r in runs
    ]
    judged = [v for v in verdicts.values() if v in ("identical", "diverged")]
    rate = (judged.count("identical"), len(judged))
    table: dict[tuple[str, str, str, str], EnvironmentRow] = {}
    for r in runs:
        if r.status != "succeeded":
            continue
        key = environment_key(r)
        row = table.setdefault(key, EnvironmentRow(*key))
        row.counts["reference" if r.id in references else verdicts.get(r.id, "pending")] += 1
    return {
        "tree": svg(charts.lineage_tree(nodes)),
        "rate": rate,
        "environments": list(table.values()),
    }


@router.get("/experiments/{experiment_id}", response_class=HTMLResponse)
def experiment_page(
    request: Request, experiment_id: IdPath, viewer: ViewerDep, db: ReadSessionDep
) -> HTMLResponse:
    """An experiment and its rerun families."""
    experiment: Experiment = svc.get_experiment(db, experiment_id)
    runs = db.scalars(
        select(Run)
        .where(Run.experiment_id == experiment.id, Run.kind == "train")
        .order_by(Run.id)
        .limit(MAX_TREE + 1)
    ).all()
    return render(
        request,
        "experiment.html",
        viewer,
        experiment=experiment,
        spec_text=spec_yaml(experiment.spec),
        truncated=len(runs) > MAX_TREE,
        runs=runs[:MAX_TREE],
        **family_view(db, runs[:MAX_TREE]),
        model=models_page.model_of(db, experiment),
    )


@router.post("/experiments/{experiment_id}/archive")
async def archive(request: Request, experiment_id: IdPath) -> RedirectResponse:
    """Archive the experiment with its runs: the lists leave them out unless asked."""
    return await _archived(request, experiment_id, archived=True)


@router.post("/experiments/{experiment_id}/unarchive")
async def unarchive(request: Request, experiment_id: IdPath) -> RedirectResponse:
    """Bring the experiment back with the runs archived with it."""
    return await _archived(request, experiment_id, archived=False)


async def _archived(request: Request, experiment_id: int, *, archived: bool) -> RedirectResponse:
    def act(db: Session, viewer: Viewer, form: dict[str, str]) -> str:
        labels.archive_experiment(
            db=db, experiment_id=experiment_id, archived=archived, actor=viewer.principal
        )
        return f"/experiments/{experiment_id}"

    return await perform(request, act)
