"""Runs: listing, detail, rerun by id, cancel, and live progress."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from typing import Annotated, Literal

from fastapi import APIRouter, Query, Request
from fastapi.responses import StreamingResponse
from sqlalchemy import func, select
from starlette.concurrency import run_in_threadpool

from service import experiments as svc
from service.api.deps import IdPath, Offset, ReadAccess, SessionDep, SubmitAccess
from service.api.responses import errors
from service.api.routing import JsonRoute
from service.api.views import run_detail, run_out, run_outs
from service.bell import Bell
from service.models import RUN_STATUSES, TERMINAL_STATUSES, Run, Verdict
from service.schemas import MAX_ID, Page, RunDetail, RunOut

router = APIRouter(prefix="/runs", tags=["runs"], route_class=JsonRoute)

Status = Literal["queued", "running", "succeeded", "failed", "cancelled"]
VerdictName = Literal["identical", "diverged", "incomparable", "reference", "none"]
Kind = Literal["train", "refine"]
# An event stream looks at its run this often even when no write in this process woke it.
_EVENTS_RECHECK_SECONDS = 1.0
assert set(RUN_STATUSES) == set(Status.__args__)  # type: ignore[attr-defined]


@router.get("", response_model=Page[RunOut], responses=errors(422))
def list_runs(
    db: SessionDep,
    _: ReadAccess,
    status: Status | None = None,
    experiment_id: Annotated[int | None, Query(ge=1, le=MAX_ID)] = None,
    verdict: VerdictName | None = None,
    kind: Kind = "train",
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
    offset: Offset = 0,
) -> Page[RunOut]:
    """Runs, newest first, filtered by status, experiment and verdict.

    Trainings by default; `kind=refine` lists the re-traces made by `POST /compare/refine`.
    """
    query = select(Run).where(Run.kind == kind)
    if status is not None:
        query = query.where(Run.status == status)
    if experiment_id is not None:
        query = query.where(Run.experiment_id == experiment_id)
    if verdict in ("identical", "diverged", "incomparable"):
        query = query.join(Verdict, Verdict.run_id == Run.id).where(Verdict.verdict == verdict)
    elif verdict == "none":
        query = query.outerjoin(Verdict, Verdict.run_id == Run.id).where(Verdict.id.is_(None))
    elif verdict == "reference":
        firsts = (
            select(func.min(Run.id))
            .where(Run.status == "succeeded", Run.kind == "train")
            .group_by(Run.family_id)
        )
        query = query.where(Run.id.in_(firsts))
    total = db.scalar(select(func.count()).select_from(query.subquery())) or 0
    rows = db.scalars(query.order_by(Run.id.desc()).limit(limit).offset(offset)).all()
    return Page(items=run_outs(db, rows), total=total, limit=limit, offset=offset)


@router.get("/{run_id}", response_model=RunDetail, responses=errors(404, 422))
def get_run(run_id: IdPath, db: SessionDep, _: ReadAccess) -> RunDetail:
    """Everything about one run: spec, seed, status, provenance, trace, verdict."""
    return run_detail(db, svc.get_run(db, run_id))


@router.post(
    "/{run_id}/rerun", status_code=202, response_model=RunOut, responses=errors(404, 409, 422)
)
def rerun(run_id: IdPath, db: SessionDep, principal: SubmitAccess) -> RunOut:
    """Queue a rerun: same experiment, spec, seed and (when known) image."""
    return run_out(db, svc.rerun(db=db, run_id=run_id, actor=principal))


@router.post("/{run_id}/cancel", response_model=RunOut, responses=errors(404, 409, 422))
def cancel(run_id: IdPath, db: SessionDep, principal: SubmitAccess) -> RunOut:
    """Cancel a queued or running run."""
    return run_out(db, svc.cancel(db=db, run_id=run_id, actor=principal))


def _snapshot(request: Request, run_id: int) -> dict[str, object]:
    with request.app.state.sessionmaker() as db:
        run = svc.get_run(db, run_id)
        return {
            "id": run.id,
            "status": run.status,
            "attempt": run.attempt,
            "progress": run.progress,
            "final_fingerprint": run.final_fingerprint,
        }


@router.get(
    "/{run_id}/events",
    response_class=StreamingResponse,
    responses={200: {"content": {"text/event-stream": {}}}, **errors(404, 422)},
)
async def events(
    run_id: IdPath, request: Request, db: SessionDep, _: ReadAccess
) -> StreamingResponse:
    """Server-sent events: the run's status and progress whenever they change."""
    await run_in_threadpool(db.close)  # the token check's connection is not held meanwhile
    first = await run_in_threadpool(_snapshot, request, run_id)  # 404 before streaming
    bell: Bell = request.app.state.runs_bell

    async def stream() -> AsyncIterator[str]:
        snapshot, last = first, None
        while True:
            woken = bell.listen()  # a run written from now on wakes the wait below
            try:
                if snapshot != last:
                    yield f"event: run\ndata: {json.dumps(snapshot)}\n\n"
                    last = snapshot
                if snapshot["status"] in TERMINAL_STATUSES or await request.is_disconnected():
                    return
                with contextlib.suppress(TimeoutError):  # and look anyway now and then
                    await asyncio.wait_for(woken.wait(), _EVENTS_RECHECK_SECONDS)
            finally:
                bell.forget(woken)
            snapshot = await run_in_threadpool(_snapshot, request, run_id)

    return StreamingResponse(
        stream(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"}
    )
