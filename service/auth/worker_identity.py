"""Worker identities: a name is one worker, registered by one token; the token is who it is.

Re-trace runs are pinned to a worker by name, and reports are checked against the worker
that holds a run, so a name must not pass between tokens while its token is valid. A name
and a hostname are what a worker declares; one token may register many names, so whatever
must run on a different worker than another (a spot check's replay) compares identities.
"""

from __future__ import annotations

from sqlalchemy import func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from service.errors import Conflict, Forbidden, ServiceError
from service.persistence.models import ApiToken, Worker, utcnow


class RegistrationRefused(ServiceError):
    """The registration asks for more than this server keeps for one worker (422)."""

    status_code = 422


def identity_key(token_id: int) -> str:
    """The stored key of the identity that authenticates with this token."""
    return f"token:{token_id}"


def identity_of(worker: Worker) -> str:
    """Who a worker is: the credential it authenticates with, today the worker token that
    registered it (every name that token registers is the same identity), as a stored key."""
    # When workers enrol credentials of their own, these two are the place that changes.
    return identity_key(worker.token_id) if worker.token_id is not None else f"worker:{worker.id}"


def _check_images(images: list[str], max_images: int | None) -> None:
    if max_images is not None and len(images) > max_images:
        msg = (
            f"a worker may advertise at most {max_images} images, not {len(images)} "
            "(REPRO_MAX_WORKER_IMAGES); nothing was stored"
        )
        raise RegistrationRefused(msg, errors=[{"loc": "body.images", "msg": msg}])


def _check_flags(flags: list[dict[str, str]] | None, max_flags: int | None) -> None:
    if flags is not None and max_flags is not None and len(flags) > max_flags:
        msg = (
            f"a worker may report at most {max_flags} readiness flags, not {len(flags)} "
            "(REPRO_MAX_WORKER_FLAGS); nothing was stored"
        )
        raise RegistrationRefused(msg, errors=[{"loc": "body.readiness_flags", "msg": msg}])


def _check_new_name(db: Session, token_id: int | None, name: str, max_names: int | None) -> None:
    """Conflict (409) when the token already holds `max_names` worker names."""
    if max_names is None or token_id is None:
        return
    # Concurrent registrations of new names under one token queue here on PostgreSQL.
    db.execute(select(ApiToken.id).where(ApiToken.id == token_id).with_for_update())
    held = db.scalar(select(func.count(Worker.id)).where(Worker.token_id == token_id)) or 0
    if held >= max_names:
        raise Conflict(
            f"this token already holds {held} worker names, the most one token may hold "
            f"(REPRO_MAX_WORKERS_PER_TOKEN={max_names}); register {name!r} again under one of "
            "them, or give this node a token of its own"
        )


def enrollment_conflict(db: Session, name: str) -> str | None:
    """Why `name` cannot be enrolled now (its credential is live), or None."""
    worker = db.scalar(select(Worker).where(Worker.name == name))
    if worker is None or not _token_is_live(db, worker.token_id):
        return None
    return (
        f"worker {name!r} is registered with a credential that is still valid (token "
        f"{worker.token_id}); to enroll it again, an admin revokes that token first "
        f"(repro token revoke {worker.token_id})"
    )


def check_enrollments(db: Session, bootstrap_id: int, most: int) -> None:
    """Conflict (409) when this bootstrap token has enrolled `most` live workers already."""
    now = utcnow()
    live = (
        db.scalar(
            select(func.count(ApiToken.id)).where(
                ApiToken.created_by_id == bootstrap_id,
                ApiToken.role == "worker",
                ApiToken.revoked_at.is_(None),
                (ApiToken.expires_at.is_(None)) | (ApiToken.expires_at > now),
            )
        )
        or 0
    )
    if live >= most:
        raise Conflict(
            f"this token has enrolled {live} workers with live credentials, the most one "
            f"token may (REPRO_MAX_ENROLLMENTS_PER_TOKEN={most}); revoke the credentials of "
            "workers that are gone, or enroll with another token"
        )


def _token_is_live(db: Session, token_id: int | None) -> bool:
    token = db.get(ApiToken, token_id) if token_id is not None else None
    if token is None or token.revoked_at is not None:
        return False
    return token.expires_at is None or token.expires_at > utcnow()


def device_counts(
    gpu: str | None, gpus: int | None, cpu_devices: int | None
) -> tuple[int, int | None]:
    """(GPUs, logical CPU devices) of a registration; an agent too old to count its GPUs
    but naming one has one, and a node with GPUs trains on them, not on CPU devices."""
    counted = gpus if gpus is not None else (1 if gpu else 0)
    return counted, (None if counted else cpu_devices)


def register_worker(
    *,
    token_id: int | None,
    db: Session,
    name: str,
    hostname: str,
    executors: list[str],
    images: list[str],
    gpu: str | None,
    allowed_images: list[str] | None = None,
    gpus: int | None = None,
    cpu_devices: int | None = None,
    accepts_code: bool = False,
    readiness_flags: list[dict[str, str]] | None = None,
    max_images: int | None = None,
    max_names: int | None = None,
    max_flags: int | None = None,
    hardware_class: str | None = None,
    pool: str | None = None,
) -> Worker:
    """The worker of this name, created or refreshed: a name is one worker's identity.

    The same token registering the same name again gets the same worker back (its id, and
    the runs it holds), with its capabilities refreshed. A name registered by another
    token is refused (Conflict, 409) while that token is valid; once it is revoked or
    expired, the name passes to the new token. An image outside `allowed_images` (when
    the operator set it) is refused (Forbidden, 403). Its `devices` are its GPUs, else the
    logical CPU devices it allows, else one. More than `max_images` images is refused
    (RegistrationRefused, 422), and so are more than `max_flags` readiness flags; a name new
    to a token that holds `max_names` names already is refused (Conflict, 409). A refusal
    stores nothing.
    """
    _check_images(images, max_images)
    _check_flags(readiness_flags, max_flags)
    refused = [image for image in images if allowed_images and image not in allowed_images]
    if refused:
        raise Forbidden(
            f"image {refused[0]!r} is not one this server lets workers advertise "
            "(REPRO_WORKER_IMAGES)"
        )
    for _ in range(2):  # a second pass after losing a race to insert the same name
        worker = db.scalar(select(Worker).where(Worker.name == name))
        if worker is None or worker.token_id != token_id:  # a name new to this token
            if worker is not None and _token_is_live(db, worker.token_id):
                raise Conflict(
                    f"worker name {name!r} is registered by another token; choose another name"
                )
            _check_new_name(db, token_id, name, max_names)
            if worker is None:
                worker = Worker(token_id=token_id, name=name)
                db.add(worker)
            worker.token_id = token_id  # the name's token was revoked or expired
        worker.hostname, worker.executors, worker.images = hostname, executors, images
        worker.gpu, worker.last_seen_at = gpu, utcnow()
        worker.accepts_code, worker.readiness_flags = accepts_code, readiness_flags
        worker.hardware_class, worker.pool = hardware_class, pool
        worker.gpus, worker.cpu_devices = device_counts(gpu, gpus, cpu_devices)
        worker.devices = worker.gpus or worker.cpu_devices or 1
        try:
            db.commit()
        except IntegrityError:
            db.rollback()
            continue
        return worker
    raise Conflict(f"worker name {name!r} is being registered by another request")
