"""The run queue: workers claim runs under a lease, keep it with heartbeats, and report.

A run is held by at most one worker: claiming is one atomic conditional update (with
`FOR UPDATE SKIP LOCKED` on PostgreSQL), and every report is checked against the holder.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, cast

from sqlalchemy import (
    CursorResult,
    and_,
    case,
    delete,
    exists,
    func,
    literal,
    or_,
    select,
    true,
    update,
)
from sqlalchemy.orm import Session, aliased

from service import metrics
from service.auth.tokens import Principal
from service.config import Settings
from service.errors import Forbidden, NotFound, NotHeld
from service.persistence.models import (
    TERMINAL_STATUSES,
    ApiToken,
    Artifact,
    Run,
    TracePointRow,
    Worker,
    utcnow,
)
from service.runs import fair_share, final_metrics, gangs, logs, resume_points
from service.runs import wakeups as bell
from service.runs.experiments import reported_image
from service.verification import replay_identity, verdicts
from service.verification.result_checks import Verification, image_allowed, still_the_checkpoint
from worker.record import hardware
from worker.result import JobResult

if TYPE_CHECKING:
    from service.worker_schemas import LogPiece


def get_worker(db: Session, worker_id: int) -> Worker:
    """The worker, or NotFound."""
    worker = db.get(Worker, worker_id)
    if worker is None:
        raise NotFound(f"worker {worker_id} is not registered")
    return worker


def check_worker(db: Session, worker_id: int, principal: Principal) -> Worker:
    """The worker if this token registered it; Forbidden (403) for anyone else's worker."""
    worker = get_worker(db, worker_id)
    if worker.token_id != principal.token_id:
        raise Forbidden(f"worker {worker_id} belongs to another token")
    return worker


def requeue_expired(*, db: Session, settings: Settings) -> None:
    """Put runs whose lease expired back in the queue, or fail them once `max_attempts` of
    their attempts ended so without making progress.

    An attempt that uploaded a checkpoint made progress: a worker preempted or scaled away
    after checkpointing is no failure of the run, and a long run on spot machines is not
    given up for it. A run that fails keeps its checkpoints (retention removes them once it
    is archived)."""
    now = utcnow()
    gangs.let_go(db, settings, now)
    lost = gangs.lost(db, settings, now)
    if lost:  # a member stopped: the attempt is over for the whole gang
        db.execute(
            update(Run)
            .where(Run.id.in_(lost))
            .values(lease_expires_at=now - timedelta(microseconds=1))
            .execution_options(synchronize_session=False)
        )
    expired = and_(Run.status == "running", Run.lease_expires_at < now)
    db.execute(
        update(Run)
        .where(expired, Run.attempt - _progressed() >= settings.max_attempts)
        .values(
            status="failed",
            worker_id=None,
            lease_expires_at=None,
            finished_at=now,
            error={
                "type": "LeaseExpired",
                "message": f"gave up after {settings.max_attempts} attempts that made no "
                "progress: the worker holding the run stopped sending heartbeats each time "
                "before it uploaded a checkpoint (its checkpoints are kept)",
            },
        )
        .execution_options(synchronize_session=False)
    )
    requeued = db.execute(
        update(Run)
        .where(expired)
        # The holder may still be training (the API or its network was away): until another
        # worker claims the run, its next heartbeat or report takes the run back.
        .values(
            status="queued",
            # A gang's holder cannot train on alone: its run waits for a new gang.
            lapsed_holder_id=case((Run.hosts == 1, Run.worker_id), else_=None),
            worker_id=None,
            lease_expires_at=None,
        )
        .execution_options(synchronize_session=False)
    )
    if cast(CursorResult[Any], requeued).rowcount:
        bell.note_queued(db)
        metrics.LEASE_EXPIRIES.inc(cast(CursorResult[Any], requeued).rowcount)
    db.commit()


def _progressed() -> Any:
    """How many of a run's attempts uploaded a checkpoint (made progress), per `Run` row."""
    return (
        select(func.count(func.distinct(Artifact.attempt)))
        .where(Artifact.run_id == Run.id, Artifact.kind == "checkpoint")
        .scalar_subquery()
    )


def _spread(candidate: type[Run], worker: Worker, live_since: datetime) -> Any:
    """A copy of a reproducibility audit goes to a worker that has not run one of its copies,
    unless every live worker already has (then any may take another)."""
    mine, theirs, other = aliased(Run), aliased(Run), aliased(Worker)
    has_copy = exists().where(mine.audit_id == candidate.audit_id, mine.worker_id == worker.id)
    idle_elsewhere = exists().where(
        other.id != worker.id,
        other.last_seen_at >= live_since,
        ~exists().where(theirs.audit_id == candidate.audit_id, theirs.worker_id == other.id),
    )
    return or_(candidate.audit_id.is_(None), ~has_copy, ~idle_elsewhere)


def waiting_reason(
    *,
    db: Session,
    required_image: str | None,
    replicas: int,
    settings: Settings,
    needs_code: bool = False,
    required_hardware: str | None = None,
    hosts: int = 1,
    run_id: int | None = None,
    progress: dict[str, Any] | None = None,
) -> str | None:
    """Why a queued run is not claimed: no live worker advertises the image it is pinned to,
    none offers as many devices as it asks replicas, or it has a code bundle and no live
    worker accepts code or the operator turned bundles off (None when some live worker
    could take it)."""
    live_since = utcnow() - timedelta(seconds=settings.lease_seconds)
    live = db.execute(
        select(Worker.images, Worker.devices, Worker.accepts_code, Worker.hardware_class).where(
            Worker.last_seen_at >= live_since
        )
    ).all()
    reasons = []
    if hosts > 1:
        reasons.extend(_gang_reason(db, settings, hosts, live_since, run_id, progress))
    if needs_code:
        reasons.extend(_code_reason(db, settings, live_since))
    if required_hardware is not None and not any(
        hardware.matches(required_hardware, cls) for *_, cls in live
    ):
        classes = sorted({cls for *_, cls in live if cls})[:5]
        seen = f" (live workers' classes: {', '.join(classes)})" if classes else ""
        reasons.append(
            f"it needs hardware of class {required_hardware} and no live worker is of it"
            f"{seen}; the run stays queued until one is, or rerun it with another hardware "
            "class (repro rerun ID --hardware CLASS, or --hardware any)"
        )
    if required_image is not None and not any(
        required_image in (images or []) for images, *_ in live
    ):
        reasons.append(
            f"no live worker advertises image {required_image}; the run stays queued "
            "until a worker that runs that image claims it"
        )
    most = max((devices for _, devices, *_ in live), default=0)
    if replicas > 1 and replicas > most:  # every worker offers one device
        offered = (
            f"the most devices any live worker offers is {most}" if live else "no worker is live"
        )
        reasons.append(
            f"needs {replicas} replicas; {offered} (GPUs, or logical CPU devices a "
            "CPU-only worker allows with --cpu-replicas); the run stays queued until a worker "
            f"with {replicas} devices claims it"
        )
    if live and not reasons:  # each need is met: but by one worker?
        reasons.extend(_no_one_fits(live, required_image, replicas, needs_code, required_hardware))
    return "; ".join(reasons) or None


def _code_reason(db: Session, settings: Settings, live_since: datetime) -> list[str]:
    """Why a run with a code bundle is not claimed: bundles are off, or no live worker
    accepts code."""
    if not settings.allow_code_bundles:
        return [
            "it runs a code bundle and code bundles are turned off on this server "
            "(REPRO_ALLOW_CODE_BUNDLES=false): no worker claims it until the operator turns "
            "them on again (or cancel it)"
        ]
    if not db.scalar(
        select(exists().where(Worker.last_seen_at >= live_since, Worker.accepts_code))
    ):
        return [
            "it runs a code bundle and no live worker accepts code: the run stays queued until "
            "a worker with the docker executor, or a process worker started with --trust-code, "
            "claims it"
        ]
    return []


def _no_one_fits(
    live: Sequence[Any],
    required_image: str | None,
    replicas: int,
    needs_code: bool,
    required_hardware: str | None,
) -> list[str]:
    """The reason when every need is met by some live worker, but none meets them all."""
    if any(
        (required_image is None or required_image in (images or []))
        and replicas <= devices
        and (accepts or not needs_code)
        and hardware.matches(required_hardware, cls)
        for images, devices, accepts, cls in live
    ):
        return []
    needs = [f"image {required_image}" if required_image else "", f"{replicas} devices"]
    needs.append("code acceptance" if needs_code else "")
    needs.append(f"hardware {required_hardware}" if required_hardware else "")
    return [
        f"no live worker offers all it needs at once ({', '.join(n for n in needs if n)}); "
        "the run stays queued until one that does claims it"
    ]


def _gang_reason(
    db: Session,
    settings: Settings,
    hosts: int,
    live_since: datetime,
    run_id: int | None,
    progress: dict[str, Any] | None,
) -> list[str]:
    """Why a multi-host run has no gang yet: one is forming, the last one did not complete
    in time, or too few live workers join gangs."""
    bound = f"{settings.gang_form_seconds:g} s"
    reasons = []
    joined = gangs.forming(db, run_id) if run_id is not None else 0
    last = progress or {}
    if joined:
        reasons.append(
            f"its gang is forming: {joined} of {hosts} workers have joined; it starts when "
            f"the rest do, or lets them go {bound} after the first joined"
        )
    elif last.get("event") == gangs.LET_GO:
        reasons.append(
            f"its last gang did not complete: {last.get('joined')} of {hosts} workers "
            f"joined and were let go after {bound} (at {last.get('at')}), for want of "
            "idle workers that fit it; it forms again when enough are idle at once"
        )
    joining = db.scalar(
        select(func.count())
        .select_from(Worker)
        .where(Worker.last_seen_at >= live_since, Worker.gang_seen_at >= live_since)
    )
    if (joining or 0) < hosts:
        reasons.append(
            f"it trains on {hosts} workers at once and {joining or 0} live worker(s) can join "
            "a gang (repro worker --gang-address): it stays queued, holding no worker, until "
            f"{hosts} idle ones that fit it are live (a gang that does not complete within "
            f"{bound} lets its members go)"
        )
    return reasons


def _hardware_fits(candidate: type[Run], hardware_class: str | None) -> Any:
    """A run requiring no class, or one this worker's class is or begins with (a class and
    a requirement are ':'-joined segments without '%' or '_': `LIKE` matches literally)."""
    if not hardware_class:
        return candidate.required_hardware.is_(None)
    mine = literal(hardware_class)
    return or_(
        candidate.required_hardware.is_(None),
        candidate.required_hardware == mine,
        mine.like(candidate.required_hardware + ":%"),
    )


def workers_seen(db: Session, limit: int = 500) -> list[Worker]:
    """Registered workers, most recently seen first."""
    return list(db.scalars(select(Worker).order_by(Worker.last_seen_at.desc()).limit(limit)))


def claim(*, db: Session, settings: Settings, worker_id: int, requeue: bool = True) -> Run | None:
    """Atomically take the queued run this worker can run that comes first (priority, then
    the submitter served least recently, then the oldest: `fair_share`), or None.

    With `requeue`, runs whose lease lapsed go back to the queue first (an API process
    leaves them alone for a grace period after it starts: their workers renew first)."""
    worker = get_worker(db, worker_id)
    if requeue:
        requeue_expired(db=db, settings=settings)
    now = utcnow()
    candidate = aliased(Run)
    runnable = and_(
        candidate.status == "queued",
        or_(
            candidate.required_image.is_(None),
            candidate.required_image.in_(worker.images or [""]),
        ),
        or_(candidate.required_worker.is_(None), candidate.required_worker == worker.name),
        _hardware_fits(candidate, worker.hardware_class),
        # A spot check's replay never goes to the identity that trained the run (unless the
        # request allowed it), however long it waits.
        replay_identity.may_claim(candidate, worker),
        candidate.replicas <= worker.devices,
        candidate.hosts == 1,  # a multi-host run goes to a gang (`gangs.join`)
        # A code bundle runs only where the worker said it accepts code, and only while the
        # operator allows bundles: turning them off holds back runs queued before.
        true()
        if worker.accepts_code and settings.allow_code_bundles
        else candidate.needs_code.is_(False),
        _spread(candidate, worker, now - timedelta(seconds=settings.lease_seconds)),
    )
    submitter = aliased(ApiToken)
    candidates = fair_share.ordered(select(candidate.id).where(runnable), candidate, submitter)
    candidates = candidates.limit(1)
    if db.get_bind().dialect.name == "postgresql":
        candidates = candidates.with_for_update(of=candidate, skip_locked=True)
    run_id = db.execute(
        update(Run)
        .where(Run.id == candidates.scalar_subquery(), Run.status == "queued")
        .values(
            status="running",
            worker_id=worker.id,
            lapsed_holder_id=None,  # another claim: the lapsed holder's attempt is over
            attempt=Run.attempt + 1,
            lease_expires_at=now + timedelta(seconds=settings.lease_seconds),
            heartbeat_at=now,
            started_at=now,
        )
        .returning(Run.id)
        .execution_options(synchronize_session=False)
    ).scalar()
    if run_id is not None:
        fair_share.take_turn(db, run_id, now)
    worker.last_seen_at = now
    db.commit()
    return db.get(Run, run_id, populate_existing=True) if run_id is not None else None


def held_run(
    db: Session,
    run_id: int,
    worker_id: int,
    *,
    attempt: int | None = None,
    renew_seconds: float = 0.0,
) -> Run:
    """The run if this worker holds it now (on `attempt`, when given); NotHeld (409)
    otherwise, Forbidden (403) while another worker holds it, NotFound if absent.

    A run whose lease lapsed and was requeued is taken back by the worker that held it, on
    the same attempt, as long as no other worker has claimed it since: the holder trained
    on while the API (or its own network) was away. Its lease then runs `renew_seconds`."""
    query = select(Run).where(Run.id == run_id)
    if db.get_bind().dialect.name == "postgresql":
        query = query.with_for_update()  # serialise with requeue, claims and other reports
    run = db.scalar(query.execution_options(populate_existing=True))
    if run is None:
        raise NotFound(f"run {run_id} does not exist")
    if run.status == "running" and run.worker_id is not None and run.worker_id != worker_id:
        raise Forbidden(f"run {run_id} is held by another worker")
    if attempt is not None and attempt != run.attempt:
        raise NotHeld(
            f"attempt {attempt} of run {run_id} is over: the run is on attempt {run.attempt} "
            f"(status {run.status})"
        )
    if run.status == "queued" and run.lapsed_holder_id == worker_id:
        now = utcnow()
        run.status, run.worker_id, run.lapsed_holder_id = "running", worker_id, None
        run.lease_expires_at = now + timedelta(seconds=renew_seconds)
        run.heartbeat_at = now
        metrics.LEASES_RETAKEN.inc()
        db.flush()
    if run.status != "running" or run.worker_id != worker_id:
        raise NotHeld(f"worker {worker_id} does not hold run {run_id} (status {run.status})")
    return run


def heartbeat(
    *,
    db: Session,
    settings: Settings,
    run_id: int,
    worker_id: int,
    progress: dict[str, Any] | None,
    attempt: int | None = None,
    principal: Principal | None = None,
    log: LogPiece | None = None,
) -> datetime:
    """Extend the lease and record progress (and new lines of the job's log); the new
    lease's end.

    The common case is one conditional UPDATE of the run (held by this worker, of this
    token, on this attempt) and, once a heartbeat period, one of the worker's last sighting:
    no row is read first. Anything else (not held, another worker's, a lapsed lease to take
    back) goes the careful way, for its precise answer."""
    now = utcnow()
    expires = now + timedelta(seconds=settings.lease_seconds)
    held = [Run.id == run_id, Run.status == "running", Run.worker_id == worker_id]
    if attempt is not None:
        held.append(Run.attempt == attempt)
    if principal is not None:
        held.append(exists().where(Worker.id == worker_id, Worker.token_id == principal.token_id))
    values: dict[str, Any] = {"lease_expires_at": expires, "heartbeat_at": now}
    if progress is not None:
        values["progress"] = progress
    renewed = db.execute(
        update(Run).where(*held).values(**values).execution_options(synchronize_session=False)
    )
    if not cast(CursorResult[Any], renewed).rowcount:
        db.rollback()
        if principal is not None:
            check_worker(db, worker_id, principal)
        gang_run = db.get(Run, run_id, populate_existing=True)
        member = None if gang_run is None else gangs.formed_member(db, gang_run, worker_id, attempt)
        if member is not None and gang_run is not None and gang_run.worker_id != worker_id:
            # Another member than rank 0: it keeps its place; the run's progress is rank 0's.
            member.seen_at = now
            db.commit()
            return gang_run.lease_expires_at or expires
        run = held_run(db, run_id, worker_id, attempt=attempt)
        run.lease_expires_at, run.heartbeat_at = expires, now
        if progress is not None:
            run.progress = progress
    seen = now - timedelta(seconds=min(settings.heartbeat_seconds, settings.lease_seconds / 2))
    db.execute(  # a busy worker is alive too
        update(Worker)
        .where(Worker.id == worker_id, Worker.last_seen_at < seen)
        .values(last_seen_at=now)
        .execution_options(synchronize_session=False)
    )
    if log is not None and attempt is not None:
        logs.append(
            db,
            run_id=run_id,
            attempt=attempt,
            offset=log.offset,
            text=log.text,
            max_bytes=settings.max_log_bytes,
        )
    bell.note_written(db, run_id)
    db.commit()
    return expires


def release(
    *,
    db: Session,
    settings: Settings,
    run_id: int,
    worker_id: int,
    reason: str,
    attempt: int | None = None,
) -> Run:
    """Give the run back to the queue (a worker shutting down); not counted as a failure.
    Any member of a gang may: its attempt is over for all of them. A gang's attempts are
    counted as lapsed ones are: after `max_attempts` that ended before a checkpoint (a
    member that fails every time, say), the run fails instead of forming gangs forever."""
    run = db.get(Run, run_id, populate_existing=True)
    member = None if run is None else gangs.formed_member(db, run, worker_id, attempt)
    if member is None or run is None or run.worker_id == worker_id:
        run = held_run(db, run_id, worker_id, attempt=attempt)
    if run.hosts > 1:
        gangs.end_attempt(db, run)
        progressed = db.scalar(select(_progressed()).where(Run.id == run.id)) or 0
        if run.attempt - progressed >= settings.max_attempts:
            error = {
                "type": "GangFailed",
                "message": f"gave up after {settings.max_attempts} gang attempts that ended "
                f"before a checkpoint; the last: {reason or 'released'}",
            }
            run.status, run.finished_at, run.error = "failed", utcnow(), error
            run.worker_id, run.lease_expires_at = None, None
            db.commit()
            return run
    run.status = "queued"
    run.worker_id = None
    run.lease_expires_at = None
    if run.hosts == 1:  # a gang's next attempt is another gang: its members' reports must
        run.attempt = max(run.attempt - 1, 0)  # name an attempt no earlier gang had
    run.progress = {"event": "released", "reason": reason}
    db.commit()
    return run


def reported_run(db: Session, run_id: int, worker_id: int, result: JobResult) -> Run | None:
    """The run if this worker already reported this result (a retry after a lost answer)."""
    run = db.get(Run, run_id, populate_existing=True)
    if run is None or run.status not in TERMINAL_STATUSES or run.worker_id != worker_id:
        return None
    checked = ((run.reported_by or {}).get("fingerprint") or {}).get("reported")
    if run.final_fingerprint == result.final_fingerprint or (
        run.reported_by is not None and checked == result.final_fingerprint
    ):
        return run
    return None


def _reporter(
    db: Session,
    worker_id: int,
    principal: Principal | None,
    result: JobResult,
    verification: Verification,
    allowed_images: list[str],
) -> dict[str, Any]:
    worker = db.get(Worker, worker_id)
    image = reported_image(result.provenance)
    return {
        "worker_id": worker_id,
        "worker": worker.name if worker is not None else None,
        "token_id": principal.token_id if principal is not None else None,
        "token": principal.name if principal is not None else None,
        "image": image,
        "image_allowed": image_allowed(image, allowed_images),
        "fingerprint": verification.record(),
        "at": utcnow().isoformat() + "Z",
    }


def complete(
    *,
    db: Session,
    run_id: int,
    worker_id: int,
    result: JobResult,
    verification: Verification | None = None,
    principal: Principal | None = None,
    allowed_images: list[str] | None = None,
    max_checkpoint_bytes: int | None = None,
    max_sortable_metrics: int = 64,
    keep_step_checkpoints: bool = False,
    attempt: int | None = None,
) -> Run:
    """Record a job's result document; a rerun gets its verdict.

    `verification` is the server's own check of the final fingerprint (see
    `service.verification.result_checks.verify_result`, done before this locks the run): a
    result that
    failed it, or reports an image outside `allowed_images`, is recorded as a failed run
    with the reason, keeping what the worker reported, and never becomes a reference.
    """
    found = reported_run(db, run_id, worker_id, result)
    if found is not None:
        return found
    run = held_run(db, run_id, worker_id, attempt=attempt)
    check = verification or Verification("not_checked", result.final_fingerprint)
    check = still_the_checkpoint(db, run_id, check)
    allowed = allowed_images or []
    run.reported_by = _reporter(db, worker_id, principal, result, check, allowed)
    error = check.error()
    if error is None and run.reported_by["image_allowed"] is False:
        error = {
            "type": "ImageNotAllowed",
            "message": f"the worker reported running image {run.reported_by['image']!r}, "
            "which is not one this server lets workers run (REPRO_WORKER_IMAGES)",
        }
    run.status = "succeeded" if result.status == "succeeded" and error is None else "failed"
    run.finished_at = utcnow()
    run.lease_expires_at = None
    run.final_fingerprint = result.final_fingerprint if error is None else None
    run.error = error or (result.error.model_dump() if result.error else None)
    take_result(db, run, result, max_sortable_metrics=max_sortable_metrics)
    if run.hosts > 1:  # every member's worker, hardware and images, by rank
        run.provenance = {**(run.provenance or {}), "gang": run.gang or []}
        gangs.end_attempt(db, run)
    if run.status == "succeeded" and run.kind == "train":
        verdicts.update_family(
            db=db, family_id=run.family_id or run.id, max_checkpoint_bytes=max_checkpoint_bytes
        )
    db.commit()
    # A finished run resumes no more: its orphan halves only take space, and so do its step
    # checkpoints unless a succeeded training keeps them for spot checks.
    keep = keep_step_checkpoints and run.kind == "train" and run.status == "succeeded"
    resume_points.prune_step_checkpoints(db, run, keep_newest=False, keep_complete=keep)
    return run


def take_result(db: Session, run: Run, result: JobResult, *, max_sortable_metrics: int) -> None:
    """What a finished run keeps of its result document: provenance, metrics, data
    fingerprints, the summary and the trace (its status, fingerprint and error are the
    caller's to judge)."""
    run.trace_granularity = result.trace_granularity
    run.provenance = result.provenance
    run.metrics = result.metrics
    run.step_metrics = result.step_metrics or None
    final_metrics.record(db, run, max_names=max_sortable_metrics)
    run.data_fingerprints = [d.model_dump() for d in result.data_fingerprints]
    run.resumed_from_step = result.resumed_from_step
    record_summary_and_trace(db, run, result)


def record_summary_and_trace(db: Session, run: Run, result: JobResult) -> None:
    run.result_summary = {
        "spec_hash": result.spec_hash,
        "seed": result.seed,
        "determinism": result.determinism,
        "eval_data_fingerprint": result.eval_data_fingerprint,
        "resumed_from_epoch": result.resumed_from_epoch,
        "resumed_from_step": result.resumed_from_step,
        "warnings": result.warnings,
        "timings": result.timings,
    }
    db.execute(delete(TracePointRow).where(TracePointRow.run_id == run.id))
    db.add_all(
        TracePointRow(
            run_id=run.id,
            seq=i,
            kind=p.kind,
            epoch=p.epoch,
            step=p.step,
            fingerprint=p.fingerprint,
            variables=p.variables,
        )
        for i, p in enumerate(result.trace)
    )
    db.flush()


def fail(
    *,
    db: Session,
    run_id: int,
    worker_id: int,
    error: dict[str, Any],
    attempt: int | None = None,
) -> Run:
    """Mark the run failed with the worker's error."""
    run = held_run(db, run_id, worker_id, attempt=attempt)
    run.status = "failed"
    run.finished_at = utcnow()
    run.lease_expires_at = None
    run.error = error
    if run.hosts > 1:
        gangs.end_attempt(db, run)
    db.commit()
    resume_points.prune_step_checkpoints(db, run, keep_newest=False)  # it resumes no more
    return run


def may_read_artifact(db: Session, artifact: Artifact, principal: Principal) -> bool:
    """Whether a worker token may download the artifact: its worker holds the artifact's run,
    or holds a re-trace that starts from that run's checkpoint."""
    held = db.scalars(
        select(Run)
        .join(Worker, Worker.id == Run.worker_id)
        .where(Run.status == "running", Worker.token_id == principal.token_id)
    ).all()
    if gangs.member_of(db, artifact.run_id, principal.token_id):
        return True  # a gang member resumes from rank 0's checkpoint too
    return any(
        run.id == artifact.run_id
        or (run.job_options or {}).get("resume_from_run") == artifact.run_id
        for run in held
    )
