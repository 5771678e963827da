"""Worker uploads that bypass the API: a presigned PUT to the object store, then a report.

With an object store (REPRO_STORAGE_URL=s3://...), the agent asks for a ticket naming the
file's kind, name, epoch, SHA-256 and size; the server checks the lease and the run's
bounds as for an upload through the API and answers a presigned PUT of a staging object,
signed for exactly that digest and length. After the PUT the agent reports the same fields;
the server checks the staged bytes are those (the store's SHA-256, or the bytes) and only
then gives them their digest's name and records the artifact.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter
from fastapi import Path as PathParam
from sqlalchemy.orm import Session

from service.api.deps import IdPath, SessionDep, SettingsDep, WorkAccess
from service.api.responses import errors
from service.api.routes.workers import after_upload
from service.api.routing import JsonRoute
from service.auth.tokens import Principal
from service.config import Settings
from service.errors import BodyTooLarge, Conflict
from service.persistence.models import Run
from service.runs import queue
from service.schemas import ArtifactOut
from service.storage import artifacts, blob_store
from service.storage.s3_store import UPLOAD_ID, S3Store
from service.worker_schemas import ArtifactUploadIn, UploadTicketOut

router = APIRouter(tags=["workers"], route_class=JsonRoute)

# One PUT carries at most this (S3's limit for a single-part upload).
MAX_SINGLE_PUT = 5 * 1024**3

UploadId = Annotated[str, PathParam(pattern=UPLOAD_ID)]


def _object_store(settings: Settings, run_id: int) -> S3Store:
    store = blob_store.open_store(settings)
    if not isinstance(store, S3Store):
        raise Conflict(
            "this server keeps files itself, not in an object store: "
            f"POST the bytes to /api/v1/runs/{run_id}/artifacts"
        )
    return store


def _held_with_room(
    db: Session, settings: Settings, principal: Principal, run_id: int, body: ArtifactUploadIn
) -> tuple[Run, artifacts.UploadBounds]:
    """The run this worker holds (renewing its lease) and its upload bounds; BodyTooLarge
    when the file's declared size does not fit them, or one PUT."""
    queue.check_worker(db, body.worker_id, principal)
    run = queue.held_run(
        db, run_id, body.worker_id, attempt=body.attempt, renew_seconds=settings.lease_seconds
    )
    bounds = artifacts.upload_bounds(run, settings)
    room, what = artifacts.upload_room(
        db, run=run, kind=body.kind, name=body.name, epoch=body.epoch, bounds=bounds
    )
    limit = min(room, MAX_SINGLE_PUT)
    if body.size > limit:
        raise BodyTooLarge(f"{what} larger than {limit} bytes")
    return run, bounds


@router.post(
    "/runs/{run_id}/artifact-uploads",
    status_code=201,
    response_model=UploadTicketOut,
    responses=errors(400, 403, 404, 409, 413, 422),
)
def ticket(
    run_id: IdPath,
    body: ArtifactUploadIn,
    db: SessionDep,
    settings: SettingsDep,
    principal: WorkAccess,
) -> UploadTicketOut:
    """A presigned PUT for one file of a held run (409 when bytes are not kept in an object
    store); 413 past the run's bounds, as for an upload through the API."""
    store = _object_store(settings, run_id)
    digest = artifacts.check_upload(body.name, body.sha256, kind=body.kind)
    _held_with_room(db, settings, principal, run_id, body)
    db.commit()
    made = store.presigned_put(run_id, sha256=digest, size=body.size)
    return UploadTicketOut(
        upload_id=made.upload_id, url=made.url, headers=made.headers, expires_at=made.expires_at
    )


@router.post(
    "/runs/{run_id}/artifact-uploads/{upload_id}",
    response_model=ArtifactOut,
    responses=errors(400, 403, 404, 409, 413, 422),
)
def finish(
    run_id: IdPath,
    upload_id: UploadId,
    body: ArtifactUploadIn,
    db: SessionDep,
    settings: SettingsDep,
    principal: WorkAccess,
) -> ArtifactOut:
    """Record a file the worker PUT with its ticket: 400 (the staged bytes removed) when they
    are not `size` bytes of `sha256`, 404 when nothing was PUT."""
    store = _object_store(settings, run_id)
    digest = artifacts.check_upload(body.name, body.sha256, kind=body.kind)
    run, bounds = _held_with_room(db, settings, principal, run_id, body)
    art = artifacts.record(
        db=db,
        run=run,
        kind=body.kind,
        name=body.name,
        epoch=body.epoch,
        sha256=digest,
        size=body.size,
        place=lambda: store.adopt(
            run_id, upload_id, space="artifacts", sha256=digest, size=body.size
        ),
        bounds=bounds,
    )
    return after_upload(db, run, art, settings)
