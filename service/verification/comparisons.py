"""Comparison reports of stored runs (kept once both runs finished, within a bound) and
per-step refinements."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
from pydantic import ValidationError
from sqlalchemy import ColumnElement, and_, delete, false, func, select
from sqlalchemy.exc import IntegrityError, OperationalError
from sqlalchemy.orm import Session, aliased

from service.auth.tokens import Principal, audit
from service.config import Settings, get_settings
from service.errors import CheckpointRefused, Conflict, NotFound
from service.persistence.models import (
    TERMINAL_STATUSES,
    Artifact,
    ComparisonRecord,
    Refinement,
    Run,
    TracePointRow,
    Verdict,
    Worker,
)
from service.runs.experiments import get_run, reported_image
from service.schemas import ComparisonReport
from service.storage import blob_store, code_bundles
from worker import errors as worker_errors
from worker.compare.verdict import CheckpointReader, RunRecord, build_report
from worker.record.checkpoint import read_arrays
from worker.record.trace import TracePoint

# -- comparison reports ----------------------------------------------------------------------


def checkpoints_of(db: Session, run_id: int) -> dict[int, tuple[Artifact, Artifact]]:
    """The run's complete checkpoints by epoch: (npz, json) artifacts both uploaded."""
    by_epoch: dict[int, dict[str, Artifact]] = {}
    for art in db.scalars(
        select(Artifact).where(Artifact.run_id == run_id, Artifact.kind == "checkpoint")
    ):
        if art.epoch is not None:
            by_epoch.setdefault(art.epoch, {})[art.name.rsplit(".", 1)[-1]] = art
    return {
        epoch: (files["npz"], files["json"])
        for epoch, files in by_epoch.items()
        if {"npz", "json"} <= set(files)
    }


def _worker_facts(db: Session, run: Run) -> dict[str, Any]:
    worker = db.get(Worker, run.worker_id) if run.worker_id is not None else None
    facts: dict[str, Any] = {}
    if worker is not None:
        facts["worker"] = {"name": worker.name, "hostname": worker.hostname, "gpu": worker.gpu}
    if run.hardware_override is not None:  # sent to other hardware on request
        facts["placement"] = {"hardware_override": run.hardware_override}
    return facts


def _trace_of(*, db: Session, run_id: int) -> list[TracePoint]:
    """The run's trace points in order, without their per-variable digests."""
    rows = db.execute(
        select(
            TracePointRow.kind, TracePointRow.epoch, TracePointRow.step, TracePointRow.fingerprint
        )
        .where(TracePointRow.run_id == run_id)
        .order_by(TracePointRow.seq)
    )
    return [
        TracePoint.model_construct(kind=k, epoch=e, step=s, fingerprint=f, variables={})
        for k, e, s, f in rows
    ]


def _variables_loader(*, db: Session, run_id: int) -> Callable[[TracePoint], Mapping[str, str]]:
    """A loader of one trace point's per-variable digests (empty if it has none)."""

    def variables_at(point: TracePoint) -> Mapping[str, str]:
        found = db.scalar(
            select(TracePointRow.variables).where(
                TracePointRow.run_id == run_id,
                TracePointRow.kind == point.kind,
                TracePointRow.epoch == point.epoch,
                TracePointRow.step == point.step,
            )
        )
        return found or {}

    return variables_at


def _checkpoint_reader(
    *,
    db: Session,
    run_id: int,
    checkpoints: Mapping[int, tuple[Artifact, Artifact]],
    limit: int,
    strict: bool,
) -> CheckpointReader:
    """A reader of the asked-for arrays of one of the run's checkpoints, within `limit` bytes."""

    def read_checkpoint(epoch: int, paths: Sequence[str]) -> Mapping[str, np.ndarray]:
        npz, _ = checkpoints[epoch]
        # The checkpoint holds the state of the trace point at the end of its epoch, in
        # that point's variable order; its own (worker-written) manifest is not needed.
        order = db.scalar(
            select(TracePointRow.variables).where(
                TracePointRow.run_id == run_id,
                TracePointRow.kind == "epoch",
                TracePointRow.epoch == epoch,
            )
        )
        if not order:
            raise worker_errors.CheckpointError(
                f"run {run_id} has no trace point for epoch {epoch}"
            )
        try:
            with blob_store.local_copy(npz.storage_url, npz.sha256, max_bytes=limit) as path:
                return read_arrays(path, list(order), paths, max_bytes=limit)
        except worker_errors.CheckpointRefused as exc:
            message = f"run {run_id}, checkpoint of epoch {epoch}: {exc}"
            if strict:
                raise worker_errors.CheckpointRefused(message) from exc
            raise worker_errors.CheckpointError(f"refused ({message})") from exc
        except blob_store.StoredBytesUnreadable as exc:
            raise worker_errors.CheckpointError(f"run {run_id}, epoch {epoch}: {exc}") from exc

    return read_checkpoint


def record_of(
    db: Session,
    run: Run,
    label: str | None = None,
    *,
    max_checkpoint_bytes: int | None = None,
    strict: bool = True,
) -> RunRecord:
    """A run as the report builder sees it; per-variable digests and arrays load on demand.

    Checkpoint arrays are read within `max_checkpoint_bytes` (default: the setting), only
    the variables asked for, mapped to names by the run's own trace point at that epoch.
    A checkpoint beyond the bounds raises CheckpointRefused when `strict`; otherwise the
    report notes that its differences could not be measured.
    """
    limit = (
        get_settings().max_checkpoint_bytes
        if max_checkpoint_bytes is None
        else max_checkpoint_bytes
    )
    trace = _trace_of(db=db, run_id=run.id)
    checkpoints = checkpoints_of(db, run.id)
    summary = run.result_summary or {}
    return RunRecord(
        label=label or f"run {run.id}",
        status=run.status,
        spec_hash=run.experiment.spec_hash,
        granularity=run.trace_granularity,
        final_fingerprint=run.final_fingerprint,
        trace=trace,
        data={int(d["epoch"]): d["fingerprint"] for d in run.data_fingerprints or []},
        provenance={**(run.provenance or {}), **_worker_facts(db, run)},
        warnings=list(summary.get("warnings") or []),
        eval_data=summary.get("eval_data_fingerprint"),
        variables_at=_variables_loader(db=db, run_id=run.id),
        checkpoint_epochs=sorted(checkpoints),
        read_checkpoint=_checkpoint_reader(
            db=db, run_id=run.id, checkpoints=checkpoints, limit=limit, strict=strict
        ),
        spec=run.experiment.spec,
    )


def compare(
    db: Session,
    a: Run,
    b: Run,
    *,
    max_checkpoint_bytes: int | None = None,
    strict: bool = True,
) -> dict[str, Any]:
    """The comparison report of run b against run a (see `worker.compare.verdict.build_report`).

    CheckpointRefused (422) if `strict` and a checkpoint it must measure is beyond bounds.
    """
    limits: dict[str, Any] = {"max_checkpoint_bytes": max_checkpoint_bytes, "strict": strict}
    try:
        report = build_report(record_of(db, a, **limits), record_of(db, b, **limits))
    except worker_errors.CheckpointRefused as exc:
        raise CheckpointRefused(str(exc)) from exc
    return {"a": a.id, "b": b.id, **report}


def _valid(report: dict[str, Any] | None) -> bool:
    # A report stored in an older format is built again; so is a bare "incomparable" of two
    # runs with different specs, from before such runs were compared with their spec diff.
    if report is None:
        return False
    if str(report.get("reason") or "").startswith("the runs have different specs"):
        return False
    try:
        ComparisonReport.model_validate(report)
    except ValidationError:
        return False
    return True


def stored_report(db: Session, a: int, b: int) -> dict[str, Any] | None:
    """The kept report of run b against run a: b's verdict when a is its reference, or a
    report computed before; None if there is none (or it is of an older format)."""
    verdict = db.scalar(
        select(Verdict.report).where(Verdict.run_id == b, Verdict.reference_run_id == a)
    )
    if _valid(verdict):
        return verdict
    kept = db.scalar(
        select(ComparisonRecord.report).where(
            ComparisonRecord.run_a_id == a, ComparisonRecord.run_b_id == b
        )
    )
    return kept if _valid(kept) else None


def _family_pair(a: type[Run], b: type[Run]) -> ColumnElement[bool]:
    """Whether run a is the reference of run b's family (its first successful training):
    the pair b's verdict is of, kept for good; there is at most one per run."""
    member = aliased(Run)
    reference = (
        select(func.min(member.id))
        .where(member.family_id == a.family_id, member.status == "succeeded")
        .where(member.kind == "train")
        .scalar_subquery()
    )
    family = and_(b.family_id == a.family_id, b.id != a.id, a.id == reference)
    # NULL (no family, or no reference yet) is not a family pair.
    return func.coalesce(family, false())


def _is_family_pair(db: Session, a: int, b: int) -> bool:
    """Whether run a is the reference of run b's family."""
    run_a, run_b = aliased(Run), aliased(Run)
    found = db.scalar(
        select(_family_pair(run_a, run_b))
        .select_from(run_a)
        .join(run_b, run_b.id == b)
        .where(run_a.id == a)
    )
    return bool(found)


def _evict_beyond(db: Session, max_stored: int) -> None:
    """Delete the kept reports of pairs other than a family's, all but the newest `max_stored`."""
    run_a, run_b = aliased(Run), aliased(Run)
    stale = (
        select(ComparisonRecord.id)
        .join(run_a, run_a.id == ComparisonRecord.run_a_id)
        .join(run_b, run_b.id == ComparisonRecord.run_b_id)
        .where(~_family_pair(run_a, run_b))
        .order_by(ComparisonRecord.id.desc())
        .offset(max_stored)
    )
    try:
        db.execute(
            delete(ComparisonRecord).where(ComparisonRecord.id.in_(stale)),
            execution_options={"synchronize_session": False},
        )
        db.commit()
    except OperationalError:
        # A concurrent eviction of the same rows (a deadlock on PostgreSQL): the next
        # report kept evicts again, so the bound holds within the requests in flight.
        db.rollback()


def _keep(db: Session, a: int, b: int, report: dict[str, Any], *, max_stored: int) -> None:
    """Keep the report of two finished runs: a family pair's for good, any other pair's
    among the newest `max_stored` others, so reading pairs cannot grow the database."""
    family = _is_family_pair(db, a, b)
    kept = db.scalar(
        select(ComparisonRecord).where(
            ComparisonRecord.run_a_id == a, ComparisonRecord.run_b_id == b
        )
    )
    if kept is None:
        db.add(ComparisonRecord(run_a_id=a, run_b_id=b, report=report))
    else:
        kept.report = report  # an older format, replaced
    try:
        db.commit()
    except IntegrityError:
        db.rollback()  # a concurrent request kept the same report first
        return
    if not family:
        _evict_beyond(db, max_stored)


def compare_ids(
    db: Session,
    a: int,
    b: int,
    *,
    max_checkpoint_bytes: int | None = None,
    max_stored: int | None = None,
) -> dict[str, Any]:
    """The report of run b against run a, computed once while kept: finished runs never
    change, so the report of two finished runs is kept and later requests read no
    checkpoint. A family pair's is kept for good (its verdict holds it too); of other
    pairs, the newest `max_stored` (default: the setting), so reading any pairs cannot
    grow the database without bound.

    NotFound for an unknown id; CheckpointRefused (422) for a checkpoint beyond bounds.
    """
    run_a, run_b = get_run(db, a), get_run(db, b)
    found = stored_report(db, a, b)
    if found is not None:
        return found
    report = compare(db, run_a, run_b, max_checkpoint_bytes=max_checkpoint_bytes)
    if run_a.status in TERMINAL_STATUSES and run_b.status in TERMINAL_STATUSES:
        limit = get_settings().max_stored_comparisons if max_stored is None else max_stored
        _keep(db, a, b, report, max_stored=limit)
    return report


# -- refinement ------------------------------------------------------------------------------


def _worker_name(db: Session, run: Run) -> str | None:
    worker = db.get(Worker, run.worker_id) if run.worker_id is not None else None
    return worker.name if worker is not None else None


def _divergent_epoch(db: Session, a: Run, b: Run, settings: Settings) -> int:
    """The epoch two runs diverged in, if they may be refined (Conflict saying why not)."""
    if a.kind != "train" or b.kind != "train":
        raise Conflict("only trainings can be refined, not re-traces")
    for run in (a, b):
        code_bundles.check_queueing_allowed(
            settings, needs_code=run.needs_code, what=f"re-tracing run {run.id}"
        )
    if a.hosts > 1 or b.hosts > 1:
        raise Conflict(
            "a run trained on several hosts is not refined: a re-trace runs on the one worker "
            "that trained it; compare the runs' traces instead"
        )
    report = compare_ids(db, a.id, b.id)
    if report["verdict"] != "diverged":
        raise Conflict(f"runs {a.id} and {b.id} are {report['verdict']}; only diverged runs refine")
    div = report["first_divergence"]
    if div["kind"] == "init":
        raise Conflict("the runs differ at initialisation, before the first step")
    if a.trace_granularity == "steps:1":
        raise Conflict("the runs were already traced after every step")
    return int(div["epoch"])


def _retrace(db: Session, original: Run, options: dict[str, Any]) -> Run:
    """A queued re-trace of `original` on the worker (by name) and image that ran it."""
    name = _worker_name(db, original)
    if name is None:
        raise Conflict(f"run {original.id} has no recorded worker to re-run it on")
    return Run(
        experiment_id=original.experiment_id,
        rerun_of_id=original.id,
        kind="refine",
        status="queued",
        required_image=original.required_image or reported_image(original.provenance),
        required_worker=name,
        job_options=options,
        replicas=original.replicas,
        needs_code=original.needs_code,  # only a worker that accepts code re-runs it
        submitter_id=original.submitter_id,
    )


def create_refinement(
    *,
    db: Session,
    a_id: int,
    b_id: int,
    settings: Settings,
    actor: Principal | None = None,
) -> Refinement:
    """Queue a per-step re-trace of the divergent epoch of two diverged runs.

    Each re-trace runs on the worker that ran its run (by name) and image, starting from
    run a's newest checkpoint before the divergent epoch (identical in both runs), so no
    earlier epoch is trained again unless no checkpoint is that recent.
    """
    a, b = get_run(db, a_id), get_run(db, b_id)
    epoch = _divergent_epoch(db, a, b, settings)
    earlier = [e for e in checkpoints_of(db, a.id) if e < epoch]
    from_epoch = max(earlier, default=0)
    options = {
        "resume_from_run": a.id,
        "resume_from_epoch": from_epoch,
        "trace_every_steps": 1,
        "until_epoch": epoch,
    }
    refine_runs = [_retrace(db, original, options) for original in (a, b)]
    db.add_all(refine_runs)
    db.flush()
    refinement = Refinement(
        run_a_id=a.id,
        run_b_id=b.id,
        epoch=epoch,
        from_epoch=from_epoch,
        refine_a_id=refine_runs[0].id,
        refine_b_id=refine_runs[1].id,
    )
    db.add(refinement)
    db.flush()
    audit(
        db=db,
        actor=actor,
        action="compare.refine",
        target_type="refinement",
        target_id=refinement.id,
        details={"a": a.id, "b": b.id, "epoch": epoch, "from_epoch": from_epoch},
    )
    db.commit()
    return refinement


def get_refinement(db: Session, refinement_id: int) -> Refinement:
    """The refinement, or NotFound."""
    found = db.get(Refinement, refinement_id)
    if found is None:
        raise NotFound(f"refinement {refinement_id} does not exist")
    return found


def _refined_report(db: Session, r: Refinement, ra: Run, rb: Run) -> dict[str, Any]:
    report = build_report(
        record_of(db, ra, f"re-trace of run {r.run_a_id}"),
        record_of(db, rb, f"re-trace of run {r.run_b_id}"),
    )
    span = (
        f"epoch {r.epoch}"
        if r.from_epoch == r.epoch - 1
        else f"epochs {r.from_epoch + 1}-{r.epoch}"
    )
    start = f"the checkpoint of epoch {r.from_epoch}" if r.from_epoch else "the start"
    if report["verdict"] == "identical":
        report["explanation"] = (
            f"Re-running {span} step by step from {start} on each run's worker gave identical "
            f"states: the divergence did not reproduce, so it is intermittent (for example a "
            f"race or an op whose result depends on scheduling)."
        )
    elif report["verdict"] == "diverged":
        step = report["first_divergence"]["step"]
        report["explanation"] = (
            f"Re-running {span} step by step from {start} on each run's worker, the runs first "
            f"differ right after step {step}. " + report["explanation"]
        )
    return report


def refinement_view(db: Session, r: Refinement) -> dict[str, Any]:
    """The refinement with its re-traces' status and, once both finished, the report."""
    ra, rb = db.get_one(Run, r.refine_a_id), db.get_one(Run, r.refine_b_id)
    if r.report is None and ra.status == rb.status == "succeeded":
        r.report = _refined_report(db, r, ra, rb)
        db.commit()
    statuses = {ra.status, rb.status}
    if r.report is not None:
        status = "finished"
    elif statuses & {"failed", "cancelled"}:
        status = "failed"
    elif "running" in statuses:
        status = "running"
    else:
        status = "queued"
    waiting = [
        f"run {x.id} waits for worker {x.required_worker!r}"
        for x in (ra, rb)
        if x.status == "queued"
    ]
    return {
        "id": r.id,
        "a": r.run_a_id,
        "b": r.run_b_id,
        "epoch": r.epoch,
        "from_epoch": r.from_epoch,
        "status": status,
        "runs": [
            {
                "id": x.id,
                "status": x.status,
                "required_worker": x.required_worker,
                "progress": x.progress,
                "error": x.error,
            }
            for x in (ra, rb)
        ],
        "waiting": waiting,
        "report": r.report,
        "created_at": r.created_at,
    }
