"""Submitting and listing experiments."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Depends, Header, Query, Request, Response
from sqlalchemy import func, select

from service.api.deps import (
    AdminAccess,
    Archived,
    IdPath,
    Offset,
    PriorityQuery,
    ReadAccess,
    ReadSessionDep,
    SessionDep,
    SettingsDep,
    SubmitAccess,
)
from service.api.responses import errors
from service.api.routing import JsonRoute
from service.api.views import run_out
from service.errors import BodyTooLarge, InvalidSpec, UnsupportedMediaType
from service.persistence.archived import narrowed
from service.persistence.models import Experiment
from service.runs import experiments as svc
from service.runs import fair_share, labels
from service.schemas import MAX_AUDIT_COPIES, ExperimentOut, Page, SubmitOut
from worker.spec import ScriptExperimentSpec, held_out_warnings

router = APIRouter(prefix="/experiments", tags=["experiments"], route_class=JsonRoute)

_FORMATS: dict[str, Literal["json", "yaml"]] = {
    "application/json": "json",
    "application/yaml": "yaml",
    "application/x-yaml": "yaml",
    "text/yaml": "yaml",
    "text/x-yaml": "yaml",
    "": "yaml",  # YAML is a superset of JSON
}

_SPEC_BODY = {
    "required": True,
    "content": {
        "application/json": {"schema": {"type": "object"}},
        "application/yaml": {"schema": {"type": "string"}},
    },
}


async def _spec_body(request: Request, settings: SettingsDep) -> bytes:
    # Read the body on the event loop; the route itself runs in the thread pool, so
    # parsing and database waits never stall other requests.
    body = await request.body()
    if len(body) > settings.max_body_bytes:
        raise BodyTooLarge(f"spec larger than {settings.max_body_bytes} bytes")
    return body


@router.post(
    "",
    status_code=201,
    response_model=SubmitOut,
    openapi_extra={"requestBody": _SPEC_BODY},
    responses={
        200: {"model": SubmitOut, "description": "idempotent replay"},
        **errors(400, 409, 413, 415, 422),
    },
)
def submit(
    request: Request,
    response: Response,
    db: SessionDep,
    settings: SettingsDep,
    principal: SubmitAccess,
    body: Annotated[bytes, Depends(_spec_body)],
    idempotency_key: Annotated[str | None, Header(max_length=200)] = None,
    copies: Annotated[
        int,
        Query(
            ge=1,
            le=MAX_AUDIT_COPIES,
            description="run this many copies at once on different workers (an audit)",
        ),
    ] = 1,
    priority: PriorityQuery = 0,
) -> SubmitOut:
    """Validate a spec (JSON or YAML), store it with its resolved seed, queue its first run.

    With `copies` > 1, queue that many runs at once as a reproducibility audit: they go to
    different workers, and `GET /repro-audits/{audit_id}` says whether all agree bitwise.
    """
    content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if content_type not in _FORMATS:
        raise UnsupportedMediaType(f"send the spec as JSON or YAML, not {content_type!r}")
    spec = svc.parse_submission(body, _FORMATS[content_type], settings=settings, db=db)
    experiment, run, created = svc.create_experiment(
        db=db,
        spec=spec,
        idempotency_key=idempotency_key,
        request_hash=svc.body_hash(body, content_type, copies, priority)
        if idempotency_key
        else None,
        actor=principal,
        copies=copies,
        settings=settings,
        priority=fair_share.check_priority(priority, principal),
    )
    if not created:
        response.status_code = 200
    return SubmitOut(
        experiment=ExperimentOut.model_validate(experiment),
        run=run_out(db, run),
        audit_id=run.audit_id,
        warnings=held_out_warnings(spec),
    )


@router.post(
    "/by-hand",
    status_code=201,
    response_model=SubmitOut,
    openapi_extra={"requestBody": _SPEC_BODY},
    responses=errors(400, 409, 413, 415, 422),
)
def record_by_hand(
    request: Request,
    db: SessionDep,
    settings: SettingsDep,
    principal: SubmitAccess,
    body: Annotated[bytes, Depends(_spec_body)],
) -> SubmitOut:
    """Record a script experiment its user runs by hand (`python train.py` with the service
    configured), and its run, running from now: no worker claims it. The script reports its
    result itself (`POST /runs/{run_id}/result`); `POST /runs/{run_id}/rerun?on_worker=true`
    retrains it on a worker."""
    content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if content_type not in _FORMATS:
        raise UnsupportedMediaType(f"send the spec as JSON or YAML, not {content_type!r}")
    spec = svc.parse_submission(body, _FORMATS[content_type], settings=settings, db=db)
    if not isinstance(spec, ScriptExperimentSpec):
        raise InvalidSpec(
            "only a script experiment (kind: script) is run by hand",
            errors=[{"loc": "kind", "msg": "must be 'script'"}],
        )
    experiment, run, _ = svc.create_experiment(
        db=db, spec=spec, actor=principal, settings=settings, by_hand=True
    )
    return SubmitOut(experiment=ExperimentOut.model_validate(experiment), run=run_out(db, run))


@router.get("", response_model=Page[ExperimentOut], responses=errors(422))
def list_experiments(
    db: ReadSessionDep,
    _: ReadAccess,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
    offset: Offset = 0,
    archived: Archived = "false",
) -> Page[ExperimentOut]:
    """Experiments, newest first; archived ones only when asked (`archived`)."""
    query = narrowed(select(Experiment), Experiment.archived_at, archived)
    total = db.scalar(select(func.count()).select_from(query.subquery())) or 0
    rows = db.scalars(query.order_by(Experiment.id.desc()).limit(limit).offset(offset))
    return Page(
        items=[ExperimentOut.model_validate(e) for e in rows],
        total=total,
        limit=limit,
        offset=offset,
    )


@router.get("/{experiment_id}", response_model=ExperimentOut, responses=errors(404, 422))
def get_experiment(experiment_id: IdPath, db: ReadSessionDep, _: ReadAccess) -> ExperimentOut:
    """One experiment."""
    return ExperimentOut.model_validate(svc.get_experiment(db, experiment_id))


@router.post(
    "/{experiment_id}/archive", response_model=ExperimentOut, responses=errors(404, 409, 422)
)
def archive(experiment_id: IdPath, db: SessionDep, principal: SubmitAccess) -> ExperimentOut:
    """Archive an experiment with its runs (409 while one of them has not ended): lists
    leave them out unless asked, their files go after the retention (`POST
    /admin/collect`). Audit-logged (`experiment.archive`, with how many runs)."""
    found = labels.archive_experiment(
        db=db, experiment_id=experiment_id, archived=True, actor=principal
    )
    return ExperimentOut.model_validate(found)


@router.post("/{experiment_id}/unarchive", response_model=ExperimentOut, responses=errors(404, 422))
def unarchive(experiment_id: IdPath, db: SessionDep, principal: SubmitAccess) -> ExperimentOut:
    """Bring an archived experiment back with the runs archived with it (runs archived on
    their own before stay so). Audit-logged (`experiment.unarchive`)."""
    found = labels.archive_experiment(
        db=db, experiment_id=experiment_id, archived=False, actor=principal
    )
    return ExperimentOut.model_validate(found)


@router.delete("/{experiment_id}", status_code=204, responses=errors(404, 409, 422))
def delete(experiment_id: IdPath, db: SessionDep, admin: AdminAccess) -> Response:
    """Delete an experiment for good (admins): 409 while it has runs (delete them first,
    `DELETE /runs/{id}`). Audit-logged (`experiment.delete`)."""
    labels.delete_experiment(db=db, experiment_id=experiment_id, actor=admin)
    return Response(status_code=204)
