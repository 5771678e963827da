"""Comparing two runs, refining a divergence step by step, and reproducibility audits."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from service.api.deps import (
    IdPath,
    ReadAccess,
    ReadSessionDep,
    SessionDep,
    SettingsDep,
    SubmitAccess,
)
from service.api.responses import errors
from service.api.routing import JsonRoute
from service.runs import audits as repro_audits
from service.schemas import (
    MAX_ID,
    ComparisonReport,
    ManyRunsComparison,
    RefineIn,
    RefinementOut,
    ReproAuditOut,
)
from service.verification import comparison_matrix as many_runs
from service.verification import comparisons

router = APIRouter(tags=["compare"], route_class=JsonRoute)

RunId = Annotated[int, Query(ge=1, le=MAX_ID, description="a run id")]


@router.get("/compare", response_model=ComparisonReport, responses=errors(404, 422))
def compare(
    a: RunId, b: RunId, db: SessionDep, settings: SettingsDep, _: ReadAccess
) -> ComparisonReport:
    """Run b against run a: identical, or where, in which variables, by how much and why.

    The report of two finished runs is kept: a rerun's against its family's reference for
    good, others among the newest `REPRO_MAX_STORED_COMPARISONS`."""
    report = comparisons.compare_ids(
        db,
        a,
        b,
        max_checkpoint_bytes=settings.max_checkpoint_bytes,
        max_stored=settings.max_stored_comparisons,
    )
    return ComparisonReport.model_validate(report)


@router.get("/compare/runs", response_model=ManyRunsComparison, responses=errors(422))
def compare_many(
    runs: Annotated[list[str], Query(description="run ids, e.g. runs=1,2,3")],
    db: ReadSessionDep,
    settings: SettingsDep,
    _: ReadAccess,
) -> ManyRunsComparison:
    """N runs at once: each pair's verdict, the spec and environment fields that differ
    among them, and their metric curves; at most `REPRO_MAX_COMPARE_RUNS` runs."""
    ids = many_runs.parse_run_ids(runs, max_runs=settings.max_compare_runs)
    return ManyRunsComparison.model_validate(many_runs.compare_runs(db, run_ids=ids))


@router.post(
    "/compare/refine",
    status_code=202,
    response_model=RefinementOut,
    responses=errors(400, 404, 409, 413, 422),
)
def refine(
    body: RefineIn, db: SessionDep, settings: SettingsDep, principal: SubmitAccess
) -> RefinementOut:
    """Re-run the divergent epoch of two diverged runs step by step, each on its own worker,
    from their last identical checkpoint, to find the first divergent step."""
    found = comparisons.create_refinement(
        db=db, a_id=body.a, b_id=body.b, actor=principal, settings=settings
    )
    return RefinementOut.model_validate(comparisons.refinement_view(db, found))


@router.get(
    "/compare/refine/{refinement_id}", response_model=RefinementOut, responses=errors(404, 422)
)
def refinement(refinement_id: IdPath, db: SessionDep, _: ReadAccess) -> RefinementOut:
    """A refinement's re-traces and, once both finished, the step-level report."""
    found = comparisons.get_refinement(db, refinement_id)
    return RefinementOut.model_validate(comparisons.refinement_view(db, found))


@router.get("/repro-audits", response_model=list[ReproAuditOut], responses=errors(422))
def repro_audit_list(
    db: ReadSessionDep,
    _: ReadAccess,
    limit: Annotated[int, Query(ge=1, le=200, description="audits, newest first")] = 50,
) -> list[ReproAuditOut]:
    """The newest reproducibility audits, each with its copies and whether all agree."""
    return [ReproAuditOut.model_validate(v) for v in repro_audits.audit_list(db, limit=limit)]


@router.get("/repro-audits/{audit_id}", response_model=ReproAuditOut, responses=errors(404, 422))
def repro_audit(audit_id: IdPath, db: ReadSessionDep, _: ReadAccess) -> ReproAuditOut:
    """A reproducibility audit (submitted with `?copies=N`): its copies and whether all agree."""
    return ReproAuditOut.model_validate(repro_audits.audit_view(db, audit_id))
