"""A spot check's report, once every replay has ended: each segment's replay against the
run's kept checkpoint at its end, who replayed it, what the sample proves and what it cost.

Only a replay by another identity than the one that trained the run (another worker token)
is evidence about that worker: a worker replaying its own run repeats whatever it did. So
`verified` needs every segment replayed bit for bit by another identity; with the trainer's
identity among the replayers the outcome is `self-consistent`, which shows determinism only.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from sqlalchemy.orm import Session

from service.persistence.models import Run, SpotCheck, Worker
from service.runs import resume_points
from service.runs.experiments import reported_image
from service.storage import blob_store
from service.verification.comparisons import record_of
from service.verification.replay_identity import NO_OTHER_WORKER, identity_that_ran
from worker.compare.verdict import RunRecord, build_report
from worker.errors import CheckpointError, CheckpointRefused
from worker.record.checkpoint import fingerprint_checkpoint
from worker.record.fingerprint import StateFingerprint
from worker.record.trace import TracePoint

SHOWN_FRACTIONS = (0.1, 0.5)  # shares of dishonest segments the report gives a catch chance for
# Every outcome a spot check ends with (pending until then).
OUTCOMES = ("verified", "self-consistent", "failed", "no-other-worker", "error")


@dataclass(frozen=True)
class Point:
    """A kept checkpoint: after global `step`, at the end of epoch `epoch` (kind "epoch") or
    inside it (kind "step"); the start of training is step 0, kind "epoch", epoch 0."""

    kind: str
    epoch: int
    step: int


def catch_chance(k: int, fraction: float) -> float:
    """The chance that k random segments include one of a share `fraction` not honestly
    trained: 1 - (1 - f)^k (a lower bound when drawn without replacement, as here)."""
    return 1.0 - (1.0 - fraction) ** k


def _worker_of(db: Session, run: Run) -> Worker | None:
    return db.get(Worker, run.worker_id) if run.worker_id is not None else None


def report(
    db: Session,
    check: SpotCheck,
    run: Run,
    replays: Mapping[int, Run],
    max_checkpoint_bytes: int | None,
) -> dict[str, Any]:
    """The spot check's report, its `outcome` one of OUTCOMES."""
    trainer = identity_that_ran(db, run)
    trained_on = _worker_of(db, run)
    original = record_of(db, run, max_checkpoint_bytes=max_checkpoint_bytes, strict=False)
    rows, failure, errors, unclaimed = [], None, [], []
    for seg in check.segments:
        replay = replays[int(seg["run_id"])]
        row = {**seg, **_where(db, replay, run, trainer, trained_on), "status": replay.status}
        row["seconds"], row["training_seconds"] = _seconds(replay), _training_seconds(replay)
        if replay.status != "succeeded":
            row["verdict"] = None
            if (replay.error or {}).get("type") == NO_OTHER_WORKER:
                unclaimed.append(f"segment {seg['index']} ({_span(seg)})")
            else:
                errors.append(f"segment {seg['index']} ({_span(seg)}): replay {replay.status}")
        else:
            verdict = _segment_report(db, original, run, replay, seg, max_checkpoint_bytes)
            row["verdict"] = verdict["verdict"]
            if verdict["verdict"] != "identical" and failure is None:
                failure = {"segment": row, "report": verdict}
        rows.append(row)
    asked = check.report or {}
    total = int(asked.get("segments_total") or len(rows))
    # Only replays by another identity are evidence about the worker that trained the run.
    independent = sum(1 for r in rows if r["identity"] is not None and not r["same_worker"])
    outcome = _outcome(rows, failure, errors, unclaimed)
    return {
        "outcome": outcome,
        "seed": str(check.seed),
        "allow_trainer": bool(asked.get("allow_trainer")),
        "segments_total": total,
        "segments_checked": len(rows),
        "independent_segments": independent,
        "segments": rows,
        "first_failure": failure,
        "errors": errors
        + [f"{u}: no worker of another identity took its replay" for u in unclaimed],
        "cost": _cost(run, rows),
        "catch_chance": {str(f): round(catch_chance(independent, f), 4) for f in SHOWN_FRACTIONS},
        "explanation": _explain(outcome, rows, failure, errors, unclaimed, total),
    }


def _outcome(
    rows: Sequence[Mapping[str, Any]],
    failure: Mapping[str, Any] | None,
    errors: Sequence[str],
    unclaimed: Sequence[str],
) -> str:
    if failure is not None:
        return "failed"
    if unclaimed:
        return "no-other-worker"
    if errors:
        return "error"
    return "self-consistent" if any(r["same_worker"] for r in rows) else "verified"


def _cost(run: Run, rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Wall time from claim to result (start-up included), and training time alone."""
    run_seconds, run_training = _seconds(run), _training_seconds(run)
    spent = sum(r["seconds"] or 0.0 for r in rows)
    trained = sum(r["training_seconds"] or 0.0 for r in rows)
    return {
        "replay_seconds": round(spent, 3),
        "run_seconds": run_seconds,
        "share": round(spent / run_seconds, 4) if run_seconds else None,
        "replay_training_seconds": round(trained, 3),
        "run_training_seconds": run_training,
        "training_share": round(trained / run_training, 4) if run_training else None,
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


def _where(
    db: Session, replay: Run, run: Run, trainer: str | None, trained_on: Worker | None
) -> dict[str, Any]:
    """Which worker replayed the segment, under which identity, and how it differs from the
    one that trained the run."""
    worker = _worker_of(db, replay)
    identity = identity_that_ran(db, replay) if worker is not None else None
    image = reported_image(replay.provenance)
    return {
        "worker": worker.name if worker is not None else None,
        "identity": identity,
        # The trainer's identity (its worker token), whatever name it registered this under.
        "same_worker": identity is not None and identity == trainer,
        # A hostname is what a worker declares, not a fact the server checked.
        "hostname": worker.hostname if worker is not None else None,
        "same_declared_hostname": worker is not None
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
        with blob_store.local_copy(
            found.npz.storage_url, found.npz.sha256, max_bytes=max_checkpoint_bytes
        ) as path:
            return fingerprint_checkpoint(
                path,
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
    unclaimed: Sequence[str],
    total: int,
) -> str:
    k = len(rows)
    sample = f"{k} of the run's {total} segments"
    if failure is not None:
        seg, found = failure["segment"], failure["report"]
        where = ", ".join(found.get("variables") or []) or found.get("reason") or ""
        by = "the identity that trained the run" if seg["same_worker"] else "another identity"
        return (
            f"Segment {seg['index']} ({_span(seg)}) replayed on {seg['worker']} ({by}) does not "
            f"end on the run's checkpoint: {found.get('verdict')}"
            + (f" in {where}" if where else "")
            + ". The run's recorded state there was not produced by training from the "
            "previous checkpoint with its spec, or the replaying worker did not replay it "
            "honestly: spot-check the run again to have another worker replay it."
        )
    if unclaimed:
        return (
            f"Not checked: no worker of another identity (worker token) than the one that "
            f"trained the run took {', '.join(unclaimed)} within "
            "REPRO_SPOT_CHECK_OTHER_WORKER_SECONDS, and a replay by the trainer proves nothing "
            "about it, so none was given to it. Spot-check again once a worker with another "
            "token is live, or with allow_trainer (--allow-trainer) to check determinism only."
            + (f" Also: {'; '.join(errors)}." if errors else "")
        )
    if errors:
        return f"Not settled: {'; '.join(errors)}. Spot-check the run again."
    own = sum(1 for r in rows if r["same_worker"])
    if own:
        return (
            f"All {sample} replayed bit for bit from the run's checkpoints, but {own} of them "
            "on the identity (worker token) that trained the run, as the request allowed "
            "(allow_trainer). A worker replaying its own run repeats whatever it did, forged "
            "weights included: this shows the training is deterministic and proves nothing "
            "about a dishonest worker. Spot-check again without allow_trainer to have other "
            "workers replay it."
        )
    if k >= total:
        return (
            f"All {total} of the run's segments replayed bit for bit from its checkpoints, "
            "each on a worker of another identity (worker token) than the one that trained "
            "it: every segment was checked, so any one not honestly trained would have been "
            "caught."
        )
    return (
        f"All {sample} replayed bit for bit from the run's checkpoints, each on a worker of "
        f"another identity (worker token) than the one that trained it. Had a tenth of the "
        f"segments not been honestly trained, {k} random segments would have caught it with "
        f"a chance of at least {catch_chance(k, 0.1):.0%}; had half, {catch_chance(k, 0.5):.0%}."
    )
