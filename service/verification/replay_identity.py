"""Who may replay a spot check's segment: never the identity that trained the run, unless
the request allowed it.

A worker replaying its own run repeats whatever it did, forged weights included, so such a
replay proves nothing about that worker. Names and hostnames are what workers declare and one
token registers many names; the rule therefore compares identities (`identity_of`: the
credential a worker authenticates with). A replay another identity could not take within
`REPRO_SPOT_CHECK_OTHER_WORKER_SECONDS` is cancelled, never handed to the trainer.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import timedelta
from typing import Any

from sqlalchemy import and_, or_, select
from sqlalchemy.orm import Session

from service.auth.worker_identity import identity_key, identity_of
from service.config import Settings
from service.persistence.models import Run, Worker, utcnow

NO_OTHER_WORKER = "NoIndependentWorker"  # the error of a replay no other identity could take


def identity_that_ran(db: Session, run: Run) -> str | None:
    """The identity that ran the run: the token that reported its result, as recorded then
    (a name can pass to another token later), else its worker's (None: no worker)."""
    token = (run.reported_by or {}).get("token_id")
    if isinstance(token, int):
        return identity_key(token)
    worker = db.get(Worker, run.worker_id) if run.worker_id is not None else None
    return identity_of(worker) if worker is not None else None


def may_claim(candidate: type[Run], worker: Worker) -> Any:
    """The claim's condition: a replay avoiding an identity is not this worker's if the
    worker is that identity (or, for a replay queued before identities, has that name)."""
    return or_(
        candidate.avoid_worker.is_(None),
        and_(
            candidate.avoid_worker != identity_of(worker),
            candidate.avoid_worker != worker.name,
        ),
    )


def could_take(worker: Worker, replay: Run, settings: Settings) -> bool:
    """Whether the worker may claim the replay once it is free: another identity, the image
    the replay needs, enough devices, and code acceptance for a bundle."""
    return (
        replay.avoid_worker not in (identity_of(worker), worker.name)
        and (replay.required_image is None or replay.required_image in (worker.images or []))
        and replay.replicas <= worker.devices
        and (not replay.needs_code or (worker.accepts_code and settings.allow_code_bundles))
    )


def end_unclaimable(db: Session, replays: Iterable[Run], settings: Settings) -> list[Run]:
    """Cancel the queued replays that waited past the wait while no live worker of another
    identity could take them; returns them (the caller commits)."""
    now = utcnow()
    waited = now - timedelta(seconds=settings.spot_check_other_worker_seconds)
    waiting = [
        r
        for r in replays
        if r.status == "queued" and r.avoid_worker is not None and r.created_at <= waited
    ]
    if not waiting:
        return []
    live_since = now - timedelta(seconds=settings.lease_seconds)
    live = list(db.scalars(select(Worker).where(Worker.last_seen_at >= live_since)))
    ended = [r for r in waiting if not any(could_take(w, r, settings) for w in live)]
    for replay in ended:
        replay.status, replay.finished_at = "cancelled", now
        replay.error = {
            "type": NO_OTHER_WORKER,
            "message": "no worker of another identity (worker token) than the one that "
            f"trained run {replay.rerun_of_id} was live to replay it within "
            f"{settings.spot_check_other_worker_seconds:g} s "
            "(REPRO_SPOT_CHECK_OTHER_WORKER_SECONDS); it was not given to the trainer",
        }
    return ended


def waiting_reason(db: Session, replays: Iterable[Run], settings: Settings) -> str | None:
    """Why a spot check's queued replays are not taken, when no live worker of another
    identity than the trainer's can take them (None otherwise): how long they wait before
    they end not checked, and what to do."""
    now = utcnow()
    waiting = [r for r in replays if r.status == "queued" and r.avoid_worker is not None]
    if not waiting:
        return None
    live_since = now - timedelta(seconds=settings.lease_seconds)
    live = list(db.scalars(select(Worker).where(Worker.last_seen_at >= live_since)))
    stuck = [r for r in waiting if not any(could_take(w, r, settings) for w in live)]
    if not stuck:
        return None
    limit = settings.spot_check_other_worker_seconds
    left = max(limit - (now - min(r.created_at for r in stuck)).total_seconds(), 0.0)
    return (
        f"{len(stuck)} replay{'s wait' if len(stuck) > 1 else ' waits'} for a worker of another "
        "identity (worker token) than the one that trained the run, and none is live: within "
        f"{left:.0f} s (REPRO_SPOT_CHECK_OTHER_WORKER_SECONDS={limit:g}) it ends not checked. "
        "Start a worker with another token, or spot-check with --allow-trainer (allow_trainer) "
        "to check determinism only"
    )
