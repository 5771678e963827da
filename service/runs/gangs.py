"""Gangs: the workers that train one multi-host run (`distribution.hosts` H) together.

A worker that can take part asks to join (`join`) each time it looks for work, with the
address its job will listen on. It joins a queued multi-host run it could train only
while, counting itself and those already in, H live idle workers that could are asking
too: a gang that cannot complete holds no worker. The H-th member completes the gang: the
members get ranks in the order they joined, the run starts (its holder is rank 0, which
reports it), and each member gets the cluster's addresses for `TF_CONFIG`. A gang that does
not complete within `gang_form_seconds` of its first member is let go.

While the run trains, every member heartbeats: a member that stops (`lapsed`) ends the
attempt for all, and so does one that gives the run back. The run then waits for a new
gang, which resumes from rank 0's newest checkpoint.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, cast

from sqlalchemy import CursorResult, delete, exists, func, or_, select, update
from sqlalchemy.orm import Session

from service.config import Settings
from service.persistence.models import TERMINAL_STATUSES, GangMember, Run, Worker, utcnow
from service.runs import wakeups as bell
from worker.record import hardware

CANDIDATES = 20  # queued multi-host runs looked at per try, first in the queue's order
LET_GO = "gang_let_go"  # a queued run's progress event: its last gang did not complete in time


@dataclass
class GangState:
    """What a worker's try to join says: `none` (no gang for it now), `forming` (it is a
    member, waiting for the rest), or `formed` (the run is its to train, as `rank`)."""

    state: str
    run_id: int | None = None
    hosts: int = 0
    joined: int = 0
    rank: int | None = None
    cluster: list[str] = field(default_factory=list)


def _fits(run: Run, worker: Worker, settings: Settings) -> bool:
    """Whether `worker` could train its share of `run` (as a claim would judge it)."""
    return (
        (run.required_image is None or run.required_image in (worker.images or []))
        and run.replicas <= worker.devices
        and hardware.matches(run.required_hardware, worker.hardware_class)
        and (not run.needs_code or (worker.accepts_code and settings.allow_code_bundles))
    )


def _members(db: Session, run_id: int) -> list[GangMember]:
    return list(
        db.scalars(select(GangMember).where(GangMember.run_id == run_id).order_by(GangMember.id))
    )


def _ready(db: Session, settings: Settings, now: datetime) -> list[Worker]:
    """Live workers asking to join gangs, idle: holding no run and in no gang."""
    since = now - timedelta(seconds=settings.lease_seconds)
    busy = exists().where(Run.status == "running", Run.worker_id == Worker.id)
    member = exists().where(GangMember.worker_id == Worker.id)
    return list(
        db.scalars(
            select(Worker).where(
                Worker.last_seen_at >= since,
                Worker.gang_seen_at.is_not(None),
                Worker.gang_seen_at >= since,
                ~busy,
                ~member,
            )
        )
    )


def let_go(db: Session, settings: Settings, now: datetime) -> None:
    """Drop memberships that are over: of runs no longer waiting for their gang or no
    longer training with it, of members that stopped asking, and of gangs that did not
    complete in time."""
    stale = now - timedelta(seconds=settings.lease_seconds)
    db.execute(
        delete(GangMember)
        .where(
            or_(
                # Forming, for a run that no longer waits for it, or a member gone quiet.
                (GangMember.rank.is_(None))
                & (
                    ~exists().where(Run.id == GangMember.run_id, Run.status == "queued")
                    | (GangMember.seen_at < stale)
                ),
                # Formed, for an attempt that is over: the run ended, was requeued after it
                # or started a later one. (Said so, not as "no longer running this
                # attempt", which a statement that waited on the gang's forming would judge
                # from before it, on PostgreSQL, and so let a fresh gang go.)
                (GangMember.rank.is_not(None))
                & exists().where(
                    Run.id == GangMember.run_id,
                    or_(
                        Run.status.in_(TERMINAL_STATUSES),
                        Run.attempt > GangMember.attempt,
                        (Run.status == "queued") & (Run.attempt >= GangMember.attempt),
                    ),
                ),
            )
        )
        .execution_options(synchronize_session=False)
    )
    too_old = now - timedelta(seconds=settings.gang_form_seconds)
    slow = select(GangMember.run_id).where(
        GangMember.rank.is_(None), GangMember.joined_at < too_old
    )
    joined = db.execute(
        select(GangMember.run_id, func.count())
        .where(GangMember.rank.is_(None), GangMember.run_id.in_(slow))
        .group_by(GangMember.run_id)
    ).all()
    if not joined:
        return
    db.execute(
        delete(GangMember)
        .where(GangMember.rank.is_(None), GangMember.run_id.in_([r for r, _ in joined]))
        .execution_options(synchronize_session=False)
    )
    for run_id, count in joined:  # the run's page says why its gang went
        db.execute(
            update(Run)
            .where(Run.id == run_id, Run.status == "queued")
            .values(progress={"event": LET_GO, "joined": count, "at": now.isoformat()})
            .execution_options(synchronize_session=False)
        )


def join(db: Session, settings: Settings, worker: Worker, address: str) -> GangState:
    """One try of `worker` (idle, reachable at `address`) to be in a gang; commits."""
    now = utcnow()
    worker.gang_seen_at = worker.last_seen_at = now
    let_go(db, settings, now)
    mine = db.scalar(select(GangMember).where(GangMember.worker_id == worker.id))
    if mine is not None and mine.done_at is not None:  # its part is over: free to join again
        db.delete(mine)
        db.flush()
        mine = None
    if mine is not None:
        mine.seen_at = now
        mine.address = address if mine.rank is None else mine.address
        state = _state(db, mine)
        db.commit()
        return state
    ready = None
    for run in _candidates(db, worker, settings):
        if ready is None:
            ready = _ready(db, settings, now)
        members = _members(db, run.id)
        others = [w for w in ready if w.id != worker.id and _fits(run, w, settings)]
        if len(members) + len(others) + 1 < run.hosts:
            continue  # it could not complete now: hold no one
        db.add(
            GangMember(
                run_id=run.id,
                attempt=run.attempt + 1,
                worker_id=worker.id,
                address=address,
                joined_at=now,
                seen_at=now,
            )
        )
        db.flush()
        members = _members(db, run.id)
        if len(members) >= run.hosts:
            _form(db, settings, run, members, now)
        mine = db.scalar(select(GangMember).where(GangMember.worker_id == worker.id))
        state = _state(db, mine) if mine is not None else GangState("none")
        db.commit()
        return state
    db.commit()
    return GangState("none")


def _candidates(db: Session, worker: Worker, settings: Settings) -> list[Run]:
    query = (
        select(Run)
        .where(Run.status == "queued", Run.hosts > 1, Run.replicas <= worker.devices)
        .where(or_(Run.required_image.is_(None), Run.required_image.in_(worker.images or [""])))
        .order_by(Run.priority.desc(), Run.id)
        .limit(CANDIDATES)
    )
    return [run for run in db.scalars(query) if _fits(run, worker, settings)]


def _form(
    db: Session, settings: Settings, run: Run, members: list[GangMember], now: datetime
) -> None:
    """Start `run` with its first `run.hosts` members, ranked in the order they joined;
    members beyond them (a race of joins) are let go."""
    gang, extra = members[: run.hosts], members[run.hosts :]
    started = db.execute(
        update(Run)
        .where(Run.id == run.id, Run.status == "queued")
        .values(
            status="running",
            worker_id=gang[0].worker_id,
            lapsed_holder_id=None,
            attempt=Run.attempt + 1,
            lease_expires_at=now + timedelta(seconds=settings.lease_seconds),
            heartbeat_at=now,
            started_at=now,
        )
        .execution_options(synchronize_session=False)
    )
    if not cast(CursorResult[Any], started).rowcount:
        # Another join formed the gang first. Members it ranked are in that gang: on
        # PostgreSQL this statement's members were read after that join committed, so
        # they may be among them. Only the rest (this worker, at least) are let go.
        for m in members:
            if m.rank is None:
                db.delete(m)
        return
    for rank, member in enumerate(gang):
        member.rank, member.seen_at = rank, now
    for member in extra:
        db.delete(member)
    db.flush()
    db.refresh(run)
    run.gang = record(db, run)
    bell.note_written(db, run.id)


def _state(db: Session, member: GangMember) -> GangState:
    run = db.get(Run, member.run_id)
    assert run is not None
    members = _members(db, run.id)
    if member.rank is None:
        return GangState("forming", run_id=run.id, hosts=run.hosts, joined=len(members))
    ranked = sorted((m for m in members if m.rank is not None), key=lambda m: m.rank or 0)
    return GangState(
        "formed",
        run_id=run.id,
        hosts=run.hosts,
        joined=len(ranked),
        rank=member.rank,
        cluster=[m.address for m in ranked],
    )


def forming(db: Session, run_id: int) -> int:
    """How many workers have joined `run_id`'s gang that is forming (0: none forms)."""
    return int(
        db.scalar(
            select(func.count())
            .select_from(GangMember)
            .where(GangMember.run_id == run_id, GangMember.rank.is_(None))
        )
        or 0
    )


def formed_member(db: Session, run: Run, worker_id: int, attempt: int | None) -> GangMember | None:
    """The member `worker_id` of `run`'s training gang (on `attempt`, if given), or None."""
    if run.hosts == 1 or run.status != "running":
        return None
    if attempt is not None and attempt != run.attempt:
        return None
    return db.scalar(
        select(GangMember).where(
            GangMember.run_id == run.id,
            GangMember.worker_id == worker_id,
            GangMember.attempt == run.attempt,
            GangMember.rank.is_not(None),
        )
    )


def lost(db: Session, settings: Settings, now: datetime) -> list[int]:
    """Training gang runs one of whose members has stopped heartbeating (and has not
    ended well): their attempt is over for every member. (Rank 0 holds the run: its
    heartbeats renew the run's lease, which lapses as any holder's.)"""
    stale = now - timedelta(seconds=settings.lease_seconds)
    return list(
        db.scalars(
            select(GangMember.run_id).where(
                GangMember.rank > 0,
                GangMember.done_at.is_(None),
                GangMember.seen_at < stale,
                exists().where(
                    Run.id == GangMember.run_id,
                    Run.status == "running",
                    Run.attempt == GangMember.attempt,
                ),
            )
        )
    )


def end_attempt(db: Session, run: Run) -> None:
    """Let every member of `run`'s gang go (the attempt is over)."""
    db.execute(
        delete(GangMember)
        .where(GangMember.run_id == run.id)
        .execution_options(synchronize_session=False)
    )


def record(db: Session, run: Run) -> list[dict[str, Any]]:
    """Every member of `run`'s training gang: rank, worker, its hardware and images."""
    rows = db.execute(
        select(GangMember, Worker)
        .join(Worker, Worker.id == GangMember.worker_id)
        .where(GangMember.run_id == run.id, GangMember.rank.is_not(None))
        .order_by(GangMember.rank)
    ).all()
    return [
        {
            "rank": m.rank,
            "worker_id": w.id,
            "worker": w.name,
            "hostname": w.hostname,
            "hardware_class": w.hardware_class,
            "images": w.images,
            "address": m.address,
        }
        for m, w in rows
    ]


def member_of(db: Session, run_id: int, token_id: int) -> bool:
    """Whether a worker of this token is in `run_id`'s training gang."""
    return bool(
        db.scalar(
            select(
                exists().where(
                    GangMember.run_id == run_id,
                    GangMember.rank.is_not(None),
                    GangMember.worker_id == Worker.id,
                    Worker.token_id == token_id,
                )
            )
        )
    )
