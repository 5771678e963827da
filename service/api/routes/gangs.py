"""Gangs: workers joining a multi-host run together, and members whose part is done."""

from __future__ import annotations

from fastapi import APIRouter, Response

from service.api.deps import IdPath, SessionDep, SettingsDep, WorkAccess
from service.api.responses import errors
from service.api.routes.workers import claim_out
from service.api.routing import JsonRoute
from service.errors import NotHeld
from service.persistence.models import Run, utcnow
from service.runs import gangs, queue
from service.worker_schemas import GangJoinIn, GangOut, WorkerReport

router = APIRouter(tags=["workers"], route_class=JsonRoute)


@router.post(
    "/workers/{worker_id}/gang", response_model=GangOut, responses=errors(400, 404, 413, 422)
)
def join_gang(
    worker_id: IdPath,
    body: GangJoinIn,
    db: SessionDep,
    settings: SettingsDep,
    principal: WorkAccess,
) -> GangOut:
    """An idle worker's try to train a multi-host run with others (ask again while
    `forming`). It joins only a gang that enough idle, live workers could complete now; once
    complete, every member gets the run's claim, its rank and the others' addresses."""
    worker = queue.check_worker(db, worker_id, principal)
    state = gangs.join(db, settings, worker, body.address)
    out = GangOut(
        state=state.state,  # type: ignore[arg-type]
        run_id=state.run_id,
        hosts=state.hosts,
        joined=state.joined,
        rank=state.rank,
        cluster=state.cluster,
    )
    if state.state == "formed" and state.run_id is not None:
        run = db.get(Run, state.run_id)
        if run is not None and run.lease_expires_at is not None:
            out.claim = claim_out(db, run, settings)
    return out


@router.post(
    "/runs/{run_id}/gang/done",
    status_code=204,
    responses=errors(400, 404, 409, 413, 422),
)
def member_done(
    run_id: IdPath, body: WorkerReport, db: SessionDep, principal: WorkAccess
) -> Response:
    """A member's job ended well: it sends no more heartbeats, and that is no loss."""
    queue.check_worker(db, body.worker_id, principal)
    run = db.get(Run, run_id)
    member = None if run is None else gangs.formed_member(db, run, body.worker_id, body.attempt)
    if member is None:
        raise NotHeld(f"worker {body.worker_id} is in no training gang of run {run_id}")
    member.done_at = utcnow()
    db.commit()
    return Response(status_code=204)
