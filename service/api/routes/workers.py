"""The worker protocol: register, claim, heartbeat, report, upload."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from collections.abc import Callable
from typing import Annotated

from fastapi import APIRouter, Header, Query, Request, Response
from fastapi.responses import FileResponse
from sqlalchemy.orm import Session
from starlette.concurrency import run_in_threadpool

from service.api.deps import (
    AnyRole,
    IdPath,
    ReadSessionDep,
    SessionDep,
    SettingsDep,
    WaitingWorkAccess,
    WorkAccess,
)
from service.api.responses import errors
from service.api.routing import JsonRoute
from service.api.views import run_out
from service.auth import worker_identity
from service.auth.provenance_key import claim_provenance
from service.auth.tokens import Principal, create_token, revoke
from service.config import Settings
from service.errors import CheckpointRefused, Conflict, Forbidden
from service.metrics import observe_claim
from service.persistence.models import Artifact, Run, Worker
from service.runs import queue, resume_points
from service.runs.claim_waits import ClaimWaits
from service.schemas import MAX_ID, ArtifactOut, RunOut
from service.storage import artifacts, blob_store
from service.verification import result_checks as verification
from service.verification import spot_checks
from service.worker_schemas import (
    CheckpointFile,
    CheckpointOut,
    ClaimedRun,
    ClaimOut,
    CompleteIn,
    EnrollOut,
    FailIn,
    HeartbeatIn,
    HeartbeatOut,
    LeaseOut,
    RegisterIn,
    RegisterOut,
    ReleaseIn,
)

router = APIRouter(tags=["workers"], route_class=JsonRoute)


@router.post(
    "/workers/register",
    status_code=201,
    response_model=RegisterOut,
    responses=errors(400, 409, 413, 422),
)
def register(
    body: RegisterIn, db: SessionDep, settings: SettingsDep, principal: WorkAccess
) -> RegisterOut:
    """Register a worker and its capabilities; returns its id and lease timing.

    A name is a worker's identity: the same token registering it again gets the same id
    (capabilities refreshed); a name another valid token registered is refused (409); an
    image outside the server's allow-list is refused (403). A token holds at most
    `REPRO_MAX_WORKERS_PER_TOKEN` names (409 for the next new one), a worker advertises at
    most `REPRO_MAX_WORKER_IMAGES` images (422)."""
    worker = _register(db, settings, body, principal.token_id)
    return _registered(worker, settings)


@router.post(
    "/workers/enroll",
    status_code=201,
    response_model=EnrollOut,
    responses=errors(400, 409, 413, 422),
)
def enroll(
    body: RegisterIn, db: SessionDep, settings: SettingsDep, principal: WorkAccess
) -> EnrollOut:
    """Enroll a worker with a bootstrap (worker) token: the worker gets a credential of its
    own, a worker token for it alone, shown once in the answer.

    From then on the worker authenticates with that credential: revoking it stops this
    worker alone, and the bootstrap token can be rotated without touching enrolled workers.
    A name whose credential is still valid is refused (409: revoke it first); a bootstrap
    token enrolls at most `REPRO_MAX_ENROLLMENTS_PER_TOKEN` workers with live credentials.
    """
    conflict = worker_identity.enrollment_conflict(db, body.name)
    if conflict is not None:
        raise Conflict(conflict)
    worker_identity.check_enrollments(db, principal.token_id, settings.max_enrollments_per_token)
    credential, secret = create_token(
        db=db, name=f"worker {body.name}", role="worker", creator=principal
    )
    try:
        worker = _register(db, settings, body, credential.id)
    except Exception:
        db.rollback()
        revoke(db=db, token_id=credential.id, actor=principal)  # never handed out
        raise
    registered = _registered(worker, settings)
    return EnrollOut(**registered.model_dump(), credential=secret, credential_id=credential.id)


def _register(db: Session, settings: Settings, body: RegisterIn, token_id: int) -> Worker:
    return worker_identity.register_worker(
        token_id=token_id,
        db=db,
        name=body.name,
        hostname=body.hostname,
        executors=body.executors,
        images=body.images,
        gpu=body.gpu,
        allowed_images=settings.worker_images,
        gpus=body.gpus,
        cpu_devices=body.cpu_devices,
        accepts_code=body.accepts_code,
        readiness_flags=(
            None if body.readiness_flags is None else [f.model_dump() for f in body.readiness_flags]
        ),
        max_images=settings.max_worker_images,
        max_flags=settings.max_worker_flags,
        max_names=settings.max_workers_per_token,
        hardware_class=body.hardware_class,
        pool=body.pool,
    )


def _registered(worker: Worker, settings: Settings) -> RegisterOut:
    return RegisterOut(
        id=worker.id,
        lease_seconds=settings.lease_seconds,
        heartbeat_seconds=settings.heartbeat_seconds,
        progress_seconds=settings.progress_seconds,
        devices=worker.devices,
        presigned_uploads=settings.storage_url.startswith("s3://"),
    )


MAX_CLAIM_WAIT = 30.0  # seconds a claim may wait on the server for a run
_RECHECK_SECONDS = 1.0  # waiting claims look at the queue this often even if nothing rang


def claim_out(db: Session, run: Run, settings: Settings) -> ClaimOut:
    checkpoint = resume_points.resume_point(db, run)
    options = run.job_options or {}
    assert run.lease_expires_at is not None
    return ClaimOut(
        run=ClaimedRun(
            id=run.id,
            experiment_id=run.experiment_id,
            spec=run.experiment.spec,
            attempt=run.attempt,
            image=run.required_image,
        ),
        lease=LeaseOut(expires_at=run.lease_expires_at, seconds=settings.lease_seconds),
        checkpoint=None
        if checkpoint is None
        else CheckpointOut(
            epoch=checkpoint.epoch,
            step=checkpoint.step,
            kind=checkpoint.kind,
            files=[
                CheckpointFile(name=a.name, artifact_id=a.id, sha256=a.sha256, size=a.size)
                for a in checkpoint.files
            ],
        ),
        limits={
            "max_model_parameters": settings.max_model_parameters,
            "max_activation_elements": settings.max_activation_elements,
            # The agent bounds the result and each upload it reads from a job by these.
            "max_result_bytes": settings.max_result_bytes,
            "max_artifact_bytes": settings.max_artifact_bytes,
        },
        job={
            k: int(options[k])
            for k in ("trace_every_steps", "until_epoch", "until_step")
            if k in options
        },
        provenance=claim_provenance(settings),
    )


def _claim_once(
    request: Request, worker_id: int, principal: Principal, settings: Settings
) -> ClaimOut | None:
    with request.app.state.sessionmaker() as db:
        queue.check_worker(db, worker_id, principal)
        requeue = time.monotonic() >= request.app.state.requeue_from
        run = queue.claim(db=db, settings=settings, worker_id=worker_id, requeue=requeue)
        return None if run is None else claim_out(db, run, settings)


@router.post(
    "/workers/{worker_id}/claim",
    response_model=ClaimOut,
    responses={204: {"description": "nothing to run (within `wait`)"}, **errors(404, 422, 503)},
)
async def claim(
    worker_id: IdPath,
    request: Request,
    settings: SettingsDep,
    principal: WaitingWorkAccess,
    wait: Annotated[
        float,
        Query(
            ge=0,
            le=MAX_CLAIM_WAIT,
            description="Seconds to wait for a runnable run before answering 204 (a long "
            "poll: the claim returns as soon as a run is queued).",
        ),
    ] = 0,
) -> ClaimOut | Response:
    """Take the oldest runnable queued run under a lease, with its newest checkpoint.

    A waiting claim holds no thread or database connection; past
    `REPRO_MAX_WAITING_CLAIMS` waiting claims the server answers 503 with `Retry-After`.
    """
    started = time.perf_counter()
    attempt = functools.partial(_claim_once, request, worker_id, principal, settings)
    if wait == 0:  # the plain poll
        out = await run_in_threadpool(attempt)
    else:
        out = await _wait_and_claim(request, attempt, wait, token_id=principal.token_id)
    observe_claim(started, claimed=out is not None)
    return Response(status_code=204) if out is None else out


async def _until_disconnected(request: Request) -> None:
    # A claim's body is never read: what arrives is read and dropped until the client leaves.
    with contextlib.suppress(Exception):
        while (await request.receive())["type"] != "http.disconnect":
            pass


async def _wait_and_claim(
    request: Request, attempt: Callable[[], ClaimOut | None], wait: float, *, token_id: int
) -> ClaimOut | None:
    waits = _claim_waits(request)
    deadline = time.monotonic() + wait
    with waits.waiter(token_id):
        # A client that leaves frees its slot at once, not when its wait would have ended.
        gone = asyncio.ensure_future(_until_disconnected(request))
        try:
            first = True
            while True:
                generation = waits.generation
                out = await waits.attempt(attempt, generation=generation, first=first)
                first = False
                if out is not None:
                    return out
                left = deadline - time.monotonic()
                if left <= 0 or waits.closed or gone.done():
                    return None
                await waits.moved(generation, left, lambda: asyncio.shield(gone))
                if waits.closed or gone.done():  # lease nothing to a leaver
                    return None
        finally:
            gone.cancel()


def _claim_waits(request: Request) -> ClaimWaits:
    # Made on first use, in the event loop that serves the claims.
    state = request.app.state
    if getattr(state, "claim_waits", None) is None:
        settings: Settings = state.settings
        state.claim_waits = ClaimWaits(
            sessionmaker=state.read_sessionmaker,
            bell=state.queue_bell,
            max_waiting=settings.max_waiting_claims,
            max_waiting_per_token=settings.max_waiting_claims_per_token,
            recheck_seconds=_RECHECK_SECONDS,
        )
    waits: ClaimWaits = state.claim_waits
    return waits


# A report about a run: its body, the run, and whether this worker still holds it.
_REPORT_ERRORS = errors(400, 404, 409, 413, 422)


@router.post("/runs/{run_id}/heartbeat", response_model=HeartbeatOut, responses=_REPORT_ERRORS)
def heartbeat(
    run_id: IdPath, body: HeartbeatIn, db: SessionDep, settings: SettingsDep, principal: WorkAccess
) -> HeartbeatOut:
    """Extend the lease of a held run and record its progress (409 if not held)."""
    expires = queue.heartbeat(
        db=db,
        settings=settings,
        run_id=run_id,
        worker_id=body.worker_id,
        progress=body.progress,
        attempt=body.attempt,
        principal=principal,
        log=body.log,
    )
    return HeartbeatOut(lease_expires_at=expires)


@router.post("/runs/{run_id}/complete", response_model=RunOut, responses=_REPORT_ERRORS)
def complete(
    run_id: IdPath, body: CompleteIn, db: SessionDep, settings: SettingsDep, principal: WorkAccess
) -> RunOut:
    """Report a held run's result document (a retried report is not written twice).

    The server recomputes the final fingerprint from the uploaded final checkpoint and
    checks the variables it holds: a mismatch (`FingerprintMismatch`,
    `CheckpointStructureMismatch`), or no final checkpoint, records the run as failed
    with the reason; a final
    checkpoint beyond the checkpoint bounds fails the run and is answered 422."""
    queue.check_worker(db, body.worker_id, principal)
    done = queue.reported_run(db, run_id, body.worker_id, body.result)
    if done is not None:
        return run_out(db, done)
    queue.held_run(db, run_id, body.worker_id, attempt=body.attempt)
    db.commit()  # the run's row is not locked while its checkpoint is hashed
    check = verification.verify_result(
        db=db, run_id=run_id, result=body.result, max_checkpoint_bytes=settings.max_checkpoint_bytes
    )
    run = queue.complete(
        db=db,
        run_id=run_id,
        worker_id=body.worker_id,
        result=body.result,
        verification=check,
        principal=principal,
        allowed_images=settings.worker_images,
        max_checkpoint_bytes=settings.max_checkpoint_bytes,
        max_sortable_metrics=settings.max_sortable_metrics,
        keep_step_checkpoints=settings.keep_checkpoints != "final",
        attempt=body.attempt,
    )
    spot_checks.after_finish(db, run, settings)
    if check.outcome == "refused":
        raise CheckpointRefused(f"run {run_id} failed: {check.message}")
    return run_out(db, run)


@router.post("/runs/{run_id}/fail", response_model=RunOut, responses=_REPORT_ERRORS)
def fail(
    run_id: IdPath, body: FailIn, db: SessionDep, settings: SettingsDep, principal: WorkAccess
) -> RunOut:
    """Report that a held run failed outside training (e.g. the job process crashed)."""
    queue.check_worker(db, body.worker_id, principal)
    run = queue.fail(
        db=db,
        run_id=run_id,
        worker_id=body.worker_id,
        error=body.error.model_dump(),
        attempt=body.attempt,
    )
    spot_checks.after_finish(db, run, settings)
    return run_out(db, run)


@router.post("/runs/{run_id}/release", response_model=RunOut, responses=_REPORT_ERRORS)
def release(
    run_id: IdPath, body: ReleaseIn, db: SessionDep, settings: SettingsDep, principal: WorkAccess
) -> RunOut:
    """Give a held run back to the queue (worker shutting down, or a gang's attempt over);
    a gang run fails once its attempts without a checkpoint reach REPRO_MAX_ATTEMPTS."""
    queue.check_worker(db, body.worker_id, principal)
    released = queue.release(
        db=db,
        settings=settings,
        run_id=run_id,
        worker_id=body.worker_id,
        reason=body.reason,
        attempt=body.attempt,
    )
    return run_out(db, released)


@router.post(
    "/runs/{run_id}/artifacts",
    status_code=201,
    response_model=ArtifactOut,
    responses=_REPORT_ERRORS,
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {
                "application/octet-stream": {"schema": {"type": "string", "format": "binary"}}
            },
        }
    },
)
async def upload_artifact(
    run_id: IdPath,
    request: Request,
    db: SessionDep,
    settings: SettingsDep,
    principal: WorkAccess,
    worker_id: Annotated[int, Query(ge=1, le=MAX_ID)],
    # What the agent uploads: checkpoints, and a succeeded job's exported model (one file).
    kind: Annotated[str, Query(pattern="^(checkpoint|model)$")],
    name: Annotated[str, Query(pattern=artifacts.SAFE_NAME)],
    x_content_sha256: Annotated[str, Header(pattern=artifacts.SHA256_HEX)],
    epoch: Annotated[int | None, Query(ge=0, le=MAX_ID)] = None,
    attempt: Annotated[int | None, Query(ge=1, le=MAX_ID)] = None,
) -> ArtifactOut:
    """Upload a file for a held run; stored only if its SHA-256 matches the header."""
    digest = artifacts.check_upload(name, x_content_sha256, kind=kind)
    queue.check_worker(db, worker_id, principal)
    held = functools.partial(
        queue.held_run, db, run_id, worker_id, attempt=attempt, renew_seconds=settings.lease_seconds
    )
    run = held()
    bounds = artifacts.upload_bounds(run, settings)  # 413 before reading past the run's bounds
    room, what = artifacts.upload_room(
        db, run=run, kind=kind, name=name, epoch=epoch, bounds=bounds
    )
    db.commit()  # release the row lock before a long upload
    staged, size = await artifacts.receive(
        request.stream(),
        directory=blob_store.spool_directory(settings),
        name=name,
        declared_sha256=digest,
        max_bytes=room,
        what=what,
    )
    store = blob_store.open_store(settings)
    try:
        run = held()
        art = artifacts.record(
            db=db,
            run=run,
            kind=kind,
            name=name,
            epoch=epoch,
            sha256=digest,
            size=size,
            place=lambda: store.put_file("artifacts", digest, staged),
            bounds=bounds,
        )
    finally:
        staged.unlink(missing_ok=True)  # moved into place, or refused
    return after_upload(db, run, art, settings)


def after_upload(db: Session, run: Run, art: Artifact, settings: Settings) -> ArtifactOut:
    """The stored artifact's answer, once superseded step checkpoints are pruned."""
    kind = art.kind
    out = ArtifactOut.model_validate(art)
    if kind == "checkpoint":
        # Superseded for resuming; a training keeps them for spot checks unless the policy
        # keeps only its final checkpoint, thinned to stay within the run's upload bounds.
        keep = run.kind == "train" and settings.keep_checkpoints != "final"
        resume_points.prune_step_checkpoints(db, run, keep_complete=keep)
        if keep:
            resume_points.thin_step_checkpoints(db, run, artifacts.upload_bounds(run, settings))
    return out


@router.get("/artifacts/{artifact_id}", response_class=FileResponse, responses=errors(404, 422))
def download_artifact(artifact_id: IdPath, db: ReadSessionDep, principal: AnyRole) -> Response:
    """The bytes of an artifact (a worker only gets those of runs it holds)."""
    art = artifacts.get_artifact(db, artifact_id)
    if principal.role == "worker":
        if not queue.may_read_artifact(db, art, principal):
            raise Forbidden(f"this worker does not hold run {art.run_id} or a re-trace of it")
    else:
        principal.require("read")
    return blob_store.download_response(
        art.storage_url,
        sha256=art.sha256,
        filename=art.name,
        for_worker=principal.role == "worker",
    )
