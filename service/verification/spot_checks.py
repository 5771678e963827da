"""Spot checks: a finished run proven by replaying a few of its segments, bit for bit.

A segment is the training between two consecutive checkpoints the run kept (the first
starts from scratch). A spot check picks K segments at random, with a seed it records so
the choice can be made again and cannot be known in advance by the worker that trained
the run, and queues each as a run of kind `spot-check`: it restores the checkpoint at the
segment's start, trains to its end, preferably on another worker, and its end state is
compared with the run's kept checkpoint there. Training is deterministic, so the two must
agree bit for bit; the first segment that does not gets the full comparison report. The
run's checkpoint is fingerprinted again from its stored bytes, not taken from the trace the
training worker reported.
"""

from __future__ import annotations

import itertools
import random
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from service.auth.tokens import Principal, audit
from service.config import Settings
from service.errors import Conflict, InvalidQuery, NotFound
from service.persistence.models import TERMINAL_STATUSES, Run, SpotCheck, Worker, utcnow
from service.runs import resume_points
from service.runs.experiments import get_run, reported_image
from service.storage import artifacts, code_bundles
from service.verification.comparisons import record_of
from worker.compare.verdict import RunRecord, build_report
from worker.errors import CheckpointError, CheckpointRefused
from worker.record.checkpoint import fingerprint_checkpoint
from worker.record.fingerprint import StateFingerprint
from worker.record.trace import TracePoint

KIND = "spot-check"
SHOWN_FRACTIONS = (0.1, 0.5)  # shares of dishonest segments the report gives a catch chance for


@dataclass(frozen=True)
class Point:
    """A kept checkpoint: after global `step`, at the end of epoch `epoch` (kind "epoch") or
    inside it (kind "step"); the start of training is step 0, kind "epoch", epoch 0."""

    kind: str
    epoch: int
    step: int


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


def catch_chance(k: int, fraction: float) -> float:
    """The chance that k random segments include one of a share `fraction` not honestly
    trained: 1 - (1 - f)^k (a lower bound when drawn without replacement, as here)."""
    return 1.0 - (1.0 - fraction) ** k


def _worker_of(db: Session, run: Run) -> Worker | None:
    return db.get(Worker, run.worker_id) if run.worker_id is not None else None


def request_spot_check(
    *,
    db: Session,
    run_id: int,
    segments: int,
    settings: Settings,
    seed: int | None = None,
    actor: Principal | None = None,
) -> SpotCheck:
    """Queue replays of `segments` randomly chosen segments of a succeeded training."""
    run = get_run(db, run_id)
    if run.kind != "train" or run.status != "succeeded":
        raise Conflict(f"run {run.id} is a {run.status} {run.kind}: only succeeded trainings")
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
    seed = secrets.randbits(63) if seed is None else seed
    chosen = [found[i] for i in pick_segments(len(found), segments, seed)]
    trained_on = _worker_of(db, run)
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
    replays = [_replay(run, seg, check.id, trained_on) for seg in chosen]
    db.add_all(replays)
    db.flush()
    check.segments = [{**s.record(), "run_id": r.id} for s, r in zip(chosen, replays, strict=True)]
    check.report = {"segments_total": len(found)}
    run.spot_check = "pending"
    audit(
        db=db,
        actor=actor,
        action="run.spot_check",
        target_type="run",
        target_id=run.id,
        details={"spot_check": check.id, "seed": str(seed), "segments": check.segments},
    )
    db.commit()
    return check


def _replay(run: Run, segment: Segment, check_id: int, trained_on: Worker | None) -> Run:
    return Run(
        experiment_id=run.experiment_id,
        rerun_of_id=run.id,
        kind=KIND,
        status="queued",
        required_image=run.required_image or reported_image(run.provenance),
        avoid_worker=trained_on.name if trained_on is not None else None,
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
        needs_code=run.needs_code,  # only a worker that accepts code replays it
    )


def get_spot_check(db: Session, check_id: int) -> SpotCheck:
    """The spot check, settled first if its replays have all ended; or NotFound."""
    check = db.get(SpotCheck, check_id)
    if check is None:
        raise NotFound(f"spot check {check_id} does not exist")
    settle(db, check)
    return check


def spot_checks_of(db: Session, run_id: int) -> list[SpotCheck]:
    """The run's spot checks, newest first, each settled if its replays have ended."""
    get_run(db, run_id)
    found = list(
        db.scalars(
            select(SpotCheck).where(SpotCheck.run_id == run_id).order_by(SpotCheck.id.desc())
        )
    )
    for check in found:
        settle(db, check)
    return found


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
    report = _report(db, check, run, replays, max_checkpoint_bytes)
    check.report, check.status, check.finished_at = report, report["outcome"], utcnow()
    newest = db.scalar(
        select(SpotCheck.id)
        .where(SpotCheck.run_id == run.id)
        .order_by(SpotCheck.id.desc())
        .limit(1)
    )
    if newest == check.id:
        run.spot_check = check.status
    db.commit()


def _report(
    db: Session,
    check: SpotCheck,
    run: Run,
    replays: Mapping[int, Run],
    max_checkpoint_bytes: int | None,
) -> dict[str, Any]:
    trained_on = _worker_of(db, run)
    original = record_of(db, run, max_checkpoint_bytes=max_checkpoint_bytes, strict=False)
    rows, failure, errors = [], None, []
    for seg in check.segments:
        replay = replays[int(seg["run_id"])]
        row = {**seg, **_where(db, replay, run, trained_on), "status": replay.status}
        row["seconds"], row["training_seconds"] = _seconds(replay), _training_seconds(replay)
        if replay.status != "succeeded":
            row["verdict"] = None
            errors.append(f"segment {seg['index']} ({_span(seg)}): replay {replay.status}")
        else:
            verdict = _segment_report(db, original, run, replay, seg, max_checkpoint_bytes)
            row["verdict"] = verdict["verdict"]
            if verdict["verdict"] != "identical" and failure is None:
                failure = {"segment": row, "report": verdict}
        rows.append(row)
    k, total = len(rows), int((check.report or {}).get("segments_total") or len(rows))
    run_seconds, run_training = _seconds(run), _training_seconds(run)
    spent = sum(r["seconds"] or 0.0 for r in rows)
    trained = sum(r["training_seconds"] or 0.0 for r in rows)
    outcome = "failed" if failure is not None else "error" if errors else "verified"
    return {
        "outcome": outcome,
        "seed": str(check.seed),
        "segments_total": total,
        "segments_checked": k,
        "segments": rows,
        "first_failure": failure,
        "errors": errors,
        # Wall time from claim to result (start-up included), and training time alone.
        "cost": {
            "replay_seconds": round(spent, 3),
            "run_seconds": run_seconds,
            "share": round(spent / run_seconds, 4) if run_seconds else None,
            "replay_training_seconds": round(trained, 3),
            "run_training_seconds": run_training,
            "training_share": round(trained / run_training, 4) if run_training else None,
        },
        "catch_chance": {str(f): round(catch_chance(k, f), 4) for f in SHOWN_FRACTIONS},
        "explanation": _explain(outcome, rows, failure, errors, total),
    }


def _span(seg: Mapping[str, Any]) -> str:
    def at(kind: str, epoch: int, step: int) -> str:
        if step == 0:
            return "the start"
        return f"the end of epoch {epoch}" if kind == "epoch" else f"step {step}"

    start = at(seg.get("from_kind", "epoch"), seg["from_epoch"], seg.get("from_step", 1))
    end = at(seg.get("to_kind", "epoch"), seg["to_epoch"], seg.get("to_step", 1))
    return f"from {start} to {end}"


def _seconds(run: Run) -> float | None:
    if run.started_at is None or run.finished_at is None:
        return None
    return round((run.finished_at - run.started_at).total_seconds(), 3)


def _training_seconds(run: Run) -> float | None:
    """The seconds the job spent training (its epochs, not its start-up), as it reported."""
    timings = (run.result_summary or {}).get("timings") or {}
    value = timings.get("training")
    return round(float(value), 3) if isinstance(value, int | float) else None


def _where(db: Session, replay: Run, run: Run, trained_on: Worker | None) -> dict[str, Any]:
    """Which worker replayed the segment and how it differs from the one that trained."""
    worker = _worker_of(db, replay)
    image = reported_image(replay.provenance)
    return {
        "worker": worker.name if worker is not None else None,
        "hostname": worker.hostname if worker is not None else None,
        "same_worker": worker is not None and trained_on is not None and worker.id == trained_on.id,
        "same_machine": worker is not None
        and trained_on is not None
        and worker.hostname == trained_on.hostname,
        "image": image,
        "same_image": image is not None and image == reported_image(run.provenance),
    }


def _segment_report(
    db: Session,
    original: RunRecord,
    run: Run,
    replay: Run,
    seg: Mapping[str, Any],
    max_checkpoint_bytes: int | None,
) -> dict[str, Any]:
    """The replay against the run up to the segment's end, the run's end state taken from
    its stored checkpoint there (not from the trace its worker reported)."""
    end = Point(seg.get("to_kind", "epoch"), int(seg["to_epoch"]), int(seg.get("to_step", -1)))
    # A step checkpoint's epoch counts the epochs finished before it: it lies in the next.
    epochs = (int(seg["from_epoch"]) + 1, end.epoch + (end.kind == "step"))
    replayed = record_of(db, replay, max_checkpoint_bytes=max_checkpoint_bytes, strict=False)
    theirs, ours = _until(replayed, end, epochs), _until(original, end, epochs)
    mine = next((p for p in reversed(theirs.trace) if isinstance(p, TracePoint)), None)
    stored = _stored_state(db, run, end, original, max_checkpoint_bytes)
    if isinstance(stored, str) or mine is None or mine.step != end.step:
        reason = stored if isinstance(stored, str) else f"the replay did not end at {_span(seg)}"
        return {"verdict": "incomparable", "reason": reason}
    point = TracePoint.model_construct(
        kind=mine.kind, epoch=mine.epoch, step=mine.step, fingerprint=stored.fingerprint,
        variables={},
    )  # fmt: skip
    loader = original.variables_at

    def variables_at(p: TracePoint) -> Mapping[str, str]:
        if p is point:
            return stored.variables
        return loader(p) if loader is not None else p.variables

    # The run's own point at the end is replaced by its stored checkpoint's state there.
    trace = [p for p in ours.trace if _step(p) < end.step] + [point]
    ours = replace(
        ours, trace=trace, final_fingerprint=stored.fingerprint, variables_at=variables_at
    )
    return build_report(ours, theirs)


def _stored_state(
    db: Session, run: Run, end: Point, original: RunRecord, max_checkpoint_bytes: int | None
) -> StateFingerprint | str:
    """The fingerprint of the run's kept checkpoint at `end`, from its stored bytes; or why
    it cannot be had."""
    found = next(
        (
            p
            for p in resume_points.complete_checkpoints(db, run)
            if p.step == end.step and p.kind == end.kind
        ),
        None,
    )
    named = next((p for p in original.trace if isinstance(p, TracePoint)), None)
    if found is None or named is None:
        return f"run {run.id} keeps no checkpoint at step {end.step} any more"
    order = list(original.variables_at(named) if original.variables_at else named.variables)
    try:
        return fingerprint_checkpoint(
            artifacts.local_path(found.npz),
            order,
            max_bytes=max_checkpoint_bytes,
            algorithm=named.fingerprint.split(":", 1)[0],
        )
    except (CheckpointRefused, CheckpointError, OSError) as exc:
        return f"run {run.id}'s checkpoint at step {end.step}: {exc}"


def _until(record: RunRecord, end: Point, epochs: tuple[int, int]) -> RunRecord:
    """The record up to `end`, its data fingerprints those of the segment's epochs (whole
    epochs: one the segment starts or ends inside of counts)."""
    trace = [
        p
        for p in record.trace
        if _step(p) < end.step or (_step(p) == end.step and _kind(p) == end.kind)
    ]
    first, last = epochs
    data = {e: d for e, d in record.data.items() if first <= e <= last}
    final = _fingerprint(trace[-1]) if trace and _step(trace[-1]) == end.step else None
    kept = [e for e in record.checkpoint_epochs if e <= end.epoch]  # where ULPs are measured
    return replace(record, trace=trace, data=data, final_fingerprint=final, checkpoint_epochs=kept)


def _step(point: TracePoint | Mapping[str, Any]) -> int:
    return point.step if isinstance(point, TracePoint) else int(point["step"])


def _kind(point: TracePoint | Mapping[str, Any]) -> str:
    return point.kind if isinstance(point, TracePoint) else str(point["kind"])


def _fingerprint(point: TracePoint | Mapping[str, Any]) -> str:
    return point.fingerprint if isinstance(point, TracePoint) else str(point["fingerprint"])


def _explain(
    outcome: str,
    rows: Sequence[Mapping[str, Any]],
    failure: Mapping[str, Any] | None,
    errors: Sequence[str],
    total: int,
) -> str:
    k = len(rows)
    sample = f"{k} of the run's {total} segments"
    if failure is not None:
        seg, report = failure["segment"], failure["report"]
        where = ", ".join(report.get("variables") or []) or report.get("reason") or ""
        return (
            f"Segment {seg['index']} ({_span(seg)}) replayed on {seg['worker']} does not end on "
            f"the run's checkpoint: {report.get('verdict')}"
            + (f" in {where}" if where else "")
            + ". The run's recorded state there was not produced by training from the "
            "previous checkpoint with its spec."
        )
    if errors:
        return f"Not settled: {'; '.join(errors)}. Spot-check the run again."
    others = sum(1 for r in rows if not r["same_worker"])
    return (
        f"All {sample} replayed bit for bit from the run's checkpoints ({others} of them on "
        f"another worker). Had a tenth of the segments not been honestly trained, {k} random "
        f"segments would have caught it with a chance of at least {catch_chance(k, 0.1):.0%}; "
        f"had half, {catch_chance(k, 0.5):.0%}."
    )
