"""Spot checks: a finished run proven by replaying a few of its segments, bit for bit.

A segment is the training between two consecutive checkpoints the run kept (the first
starts from scratch). A spot check picks K segments at random, with a seed it records so
the choice can be made again and cannot be known in advance by the worker that trained
the run, and queues each as a run of kind `spot-check`: it restores the checkpoint at the
segment's start, trains to its end on a worker of another identity than the one that trained
the run (see replay_identity), and its end state is compared with the run's kept checkpoint
there. Training is deterministic, so the two must
agree bit for bit; the first segment that does not gets the full comparison report. The
run's checkpoint is fingerprinted again from its stored bytes, not taken from the trace the
training worker reported.
"""

from __future__ import annotations

import itertools
import random
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from service.auth.tokens import Principal, audit
from service.config import Settings
from service.errors import Conflict, InvalidQuery, NotFound
from service.persistence.models import TERMINAL_STATUSES, Run, SpotCheck, utcnow
from service.runs import resume_points
from service.runs.experiments import get_run, recorded_hardware, reported_image
from service.storage import code_bundles
from service.verification import replay_identity
from service.verification.spot_check_reports import OUTCOMES as OUTCOMES
from service.verification.spot_check_reports import Point as Point
from service.verification.spot_check_reports import catch_chance as catch_chance
from service.verification.spot_check_reports import report

KIND = "spot-check"


@dataclass(frozen=True)
class Segment:
    """Training from one kept checkpoint to the next."""

    index: int
    start: Point
    end: Point

    def record(self) -> dict[str, Any]:
        """How the segment is stored with its spot check (the replay's run id added)."""
        return {
            "index": self.index,
            "from_epoch": self.start.epoch,
            "to_epoch": self.end.epoch,
            "from_step": self.start.step,
            "to_step": self.end.step,
            "from_kind": self.start.kind,
            "to_kind": self.end.kind,
        }


def segments_of(kept: Sequence[Point]) -> list[Segment]:
    """The segments between consecutive kept checkpoints, the first from the start; at one
    step an epoch checkpoint stands for both kinds."""
    by_step: dict[int, Point] = {0: Point("epoch", 0, 0)}
    for point in kept:
        if point.step > 0 and (point.step not in by_step or point.kind == "epoch"):
            by_step[point.step] = point
    points = [by_step[step] for step in sorted(by_step)]
    return [Segment(i, a, b) for i, (a, b) in enumerate(itertools.pairwise(points))]


def kept_points(db: Session, run: Run) -> list[Point]:
    """The run's complete checkpoints, epoch and step ones, oldest first."""
    return [Point(p.kind, p.epoch, p.step) for p in resume_points.complete_checkpoints(db, run)]


def pick_segments(count: int, k: int, seed: int) -> list[int]:
    """The indexes of `k` of `count` segments, chosen by `seed` (all when k >= count)."""
    return sorted(random.Random(seed).sample(range(count), min(k, count)))


def request_spot_check(
    *,
    db: Session,
    run_id: int,
    segments: int,
    settings: Settings,
    seed: int | None = None,
    allow_trainer: bool = False,
    actor: Principal | None = None,
) -> SpotCheck:
    """Queue replays of `segments` randomly chosen segments of a succeeded training, for
    workers of another identity than the trainer's unless `allow_trainer`."""
    run = get_run(db, run_id)
    if run.kind != "train" or run.status != "succeeded":
        raise Conflict(f"run {run.id} is a {run.status} {run.kind}: only succeeded trainings")
    if run.hosts > 1:
        raise Conflict(
            f"run {run.id} trained on {run.hosts} hosts: a replay would need a gang, and "
            "spot checks replay on one worker; rerun it instead (its verdict is bitwise)"
        )
    if not 1 <= segments <= settings.max_spot_check_segments:
        raise InvalidQuery(
            f"segments must be 1..{settings.max_spot_check_segments} "
            "(REPRO_MAX_SPOT_CHECK_SEGMENTS)"
        )
    code_bundles.check_queueing_allowed(
        settings, needs_code=run.needs_code, what=f"replaying run {run.id}"
    )
    found = segments_of(kept_points(db, run))
    if not found:
        raise Conflict(f"run {run.id} kept no checkpoint to replay from (REPRO_KEEP_CHECKPOINTS)")
    for pending in db.scalars(
        select(SpotCheck).where(SpotCheck.run_id == run.id, SpotCheck.status == "pending")
    ).all():  # a check that waited in vain ends here, and holds no place below
        _settle_waited(db, pending, settings)
    _check_pending(db, run, settings.max_pending_spot_checks_per_run)
    seed = secrets.randbits(63) if seed is None else seed
    chosen = [found[i] for i in pick_segments(len(found), segments, seed)]
    avoid = None if allow_trainer else replay_identity.identity_that_ran(db, run)
    check = SpotCheck(
        run_id=run.id,
        seed=seed,
        requested=segments,
        segments=[],
        status="pending",
        requested_by=actor.name if actor is not None else None,
    )
    db.add(check)
    db.flush()
    replays = [_replay(run, seg, check.id, avoid) for seg in chosen]
    db.add_all(replays)
    db.flush()
    check.segments = [{**s.record(), "run_id": r.id} for s, r in zip(chosen, replays, strict=True)]
    check.report = {"segments_total": len(found), "allow_trainer": allow_trainer}
    run.spot_check = "pending"
    audit(
        db=db,
        actor=actor,
        action="run.spot_check",
        target_type="run",
        target_id=run.id,
        details={
            "spot_check": check.id,
            "seed": str(seed),
            "segments": check.segments,
            "allow_trainer": allow_trainer,
        },
    )
    db.commit()
    return check


def _check_pending(db: Session, run: Run, most: int) -> None:
    """Conflict (409) when the run already has `most` spot checks not ended."""
    # A write first, so concurrent requests for one run take turns before counting: a row
    # lock on PostgreSQL, the database's write lock on SQLite.
    db.execute(update(Run).where(Run.id == run.id).values(spot_check=Run.spot_check))
    pending = db.scalar(
        select(func.count(SpotCheck.id)).where(
            SpotCheck.run_id == run.id, SpotCheck.status == "pending"
        )
    )
    if (pending or 0) >= most:
        db.rollback()
        raise Conflict(
            f"run {run.id} already has {pending} spot checks not ended, the most one run may "
            f"have (REPRO_MAX_PENDING_SPOT_CHECKS_PER_RUN={most}): wait for one to end, or "
            "cancel its replays"
        )


def _replay(run: Run, segment: Segment, check_id: int, avoid: str | None) -> Run:
    return Run(
        experiment_id=run.experiment_id,
        rerun_of_id=run.id,
        kind=KIND,
        status="queued",
        # The image the run recorded running on first: a tag it was pinned by names no one
        # image, and a run not pinned at all still ran on the image it recorded.
        required_image=reported_image(run.provenance) or run.required_image,
        # And its hardware class: a replay elsewhere proves something only on the same one.
        required_hardware=recorded_hardware(run.provenance) or run.required_hardware,
        avoid_worker=avoid,  # the trainer's identity (None: the request allowed it)
        job_options={
            "resume_from_run": run.id,
            **(
                {"resume_from_step": segment.start.step}
                if segment.start.kind == "step"
                else {"resume_from_epoch": segment.start.epoch}
            ),
            **(
                {"until_step": segment.end.step}
                if segment.end.kind == "step"
                else {"until_epoch": segment.end.epoch}
            ),
            "spot_check_id": check_id,
        },
        replicas=run.replicas,
        submitter_id=run.submitter_id,  # the run's own submitter's share of the queue
        needs_code=run.needs_code,  # only a worker that accepts code replays it
    )


def get_spot_check(db: Session, check_id: int, settings: Settings) -> SpotCheck:
    """The spot check, settled first if its replays have all ended (or waited in vain for
    another identity); or NotFound."""
    check = db.get(SpotCheck, check_id)
    if check is None:
        raise NotFound(f"spot check {check_id} does not exist")
    _settle_waited(db, check, settings)
    return check


def spot_checks_of(db: Session, run_id: int, settings: Settings) -> list[SpotCheck]:
    """The run's spot checks, newest first, each settled if its replays have ended."""
    get_run(db, run_id)
    found = list(
        db.scalars(
            select(SpotCheck).where(SpotCheck.run_id == run_id).order_by(SpotCheck.id.desc())
        )
    )
    for check in found:
        _settle_waited(db, check, settings)
    return found


def _settle_waited(db: Session, check: SpotCheck, settings: Settings) -> None:
    """Settle the check, first ending the replays no other identity could take in time."""
    if check.status == "pending":
        ids = [int(s["run_id"]) for s in check.segments]
        replays = db.scalars(select(Run).where(Run.id.in_(ids)))
        if replay_identity.end_unclaimable(db, replays, settings):
            db.commit()
    settle(db, check)


def after_finish(db: Session, run: Run, settings: Settings) -> None:
    """What follows a run's end: its checkpoints cut to the retention policy (a training),
    its spot check settled (a replay), and a spot check queued when the operator asks for
    one of every succeeded training (REPRO_SPOT_CHECK_SEGMENTS)."""
    if run.kind == "train":
        resume_points.retain_checkpoints(db, run, settings.keep_checkpoints)
    settle_for(db, run)
    if run.kind == "train" and run.status == "succeeded" and settings.spot_check_segments:
        try:
            request_spot_check(
                db=db, run_id=run.id, segments=settings.spot_check_segments, settings=settings
            )
        except Conflict:  # nothing kept to replay from: the run page says so when asked
            db.rollback()


def shown_for(db: Session, run_id: int, limit: int = 10) -> list[SpotCheck]:
    """The run's newest spot checks as stored (pages only read: nothing is settled here)."""
    return list(
        db.scalars(
            select(SpotCheck)
            .where(SpotCheck.run_id == run_id)
            .order_by(SpotCheck.id.desc())
            .limit(limit)
        )
    )


def settle_for(db: Session, run: Run) -> None:
    """Settle the spot check a replay belongs to, if this replay was its last to end."""
    check_id = (run.job_options or {}).get("spot_check_id") if run.kind == KIND else None
    check = db.get(SpotCheck, int(check_id)) if check_id is not None else None
    if check is not None:
        settle(db, check)


def settle(db: Session, check: SpotCheck, *, max_checkpoint_bytes: int | None = None) -> None:
    """Once every replay has ended: compare each with the run, record the outcome."""
    if check.status != "pending":
        return
    ids = [int(s["run_id"]) for s in check.segments]
    replays = {r.id: r for r in db.scalars(select(Run).where(Run.id.in_(ids)))}
    if any(r.status not in TERMINAL_STATUSES for r in replays.values()):
        return
    run = get_run(db, check.run_id)
    found = report(db, check, run, replays, max_checkpoint_bytes)
    check.report, check.status, check.finished_at = found, found["outcome"], utcnow()
    newest = db.scalar(
        select(SpotCheck.id)
        .where(SpotCheck.run_id == run.id)
        .order_by(SpotCheck.id.desc())
        .limit(1)
    )
    if newest == check.id:
        run.spot_check = check.status
    db.commit()
