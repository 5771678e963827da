"""Submitting experiments and rerunning runs."""

from __future__ import annotations

import contextlib
import hashlib
from typing import Any, Literal

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from service.auth.tokens import Principal, audit
from service.config import Settings
from service.errors import Conflict, InvalidSpec, MalformedBody, NotFound
from service.json_bounds import MAX_INT_DIGITS, exceeds_int_digits
from service.persistence.models import Experiment, Run, utcnow
from service.runs import result_size, resume_points
from service.runs.params import param_rows
from service.storage import code_bundles, datasets, model_definitions
from worker.errors import ArchitectureError, MalformedSpecError, SpecError
from worker.models import registry
from worker.spec import (
    AnySpec,
    ExperimentSpec,
    ScriptExperimentSpec,
    parse_any_spec,
    parse_spec_text,
    suggesting,
)
from worker.training.seeds import resolve_seed


def parse_submission(
    body: bytes, fmt: Literal["json", "yaml"], *, settings: Settings, db: Session | None = None
) -> AnySpec:
    """The validated spec of a request body; MalformedBody or InvalidSpec otherwise."""
    try:
        spec = parse_spec_text(body, fmt=fmt)
        if isinstance(spec, ScriptExperimentSpec):
            check_script(db, spec, settings)
            check_storable(spec)
            return spec
        with code_components(db, spec, settings):
            registry.check_spec(spec)
    except MalformedSpecError as exc:
        raise MalformedBody(str(exc), errors=exc.errors) from None
    except RecursionError:  # the parsers recurse once per level of nesting
        raise MalformedBody(f"the {fmt.upper()} spec nests too deeply") from None
    except SpecError as exc:
        hinted = suggesting(exc)  # "did you mean 'batch_size'?" for a misspelled field
        raise InvalidSpec(str(hinted), errors=hinted.errors) from None
    except ValueError as exc:  # an integer too long for Python, read or written back
        if not exceeds_int_digits(exc):
            raise
        msg = f"a number in the spec has more than {MAX_INT_DIGITS} digits"
        raise InvalidSpec(msg, errors=[{"loc": "$", "msg": msg}]) from None
    with code_components(db, spec, settings):
        check_limits(spec, settings)
    check_deliverable(spec, settings)
    check_storable(spec)
    return spec


def code_components(
    db: Session | None, spec: ExperimentSpec, settings: Settings
) -> contextlib.AbstractContextManager[None]:
    """A block in which the components of the spec's code bundle count as known; InvalidSpec
    when bundles are off or the spec's bundle is not stored."""
    if spec.code is None:
        return contextlib.nullcontext()
    code_bundles.check_allowed(settings, loc="code")
    bundle = code_bundles.require_held(db, spec.code, settings) if db is not None else None
    entry_points = bundle.entry_points if bundle is not None else []
    return registry.bundled_components(entry_points, f"code bundle {spec.code}")


def check_script(
    db: Session | None, spec: ScriptExperimentSpec, settings: Settings, *, new: bool = True
) -> None:
    """InvalidSpec unless code runs here, the script's directory is stored (and, for a new
    experiment, not archived) and holds the file `script.entry` names."""
    code_bundles.check_allowed(settings, loc="code")
    bundle = None if db is None else code_bundles.require_held(db, spec.code, settings, new=new)
    if bundle is None:
        return
    files = {str(f.get("path")) for f in bundle.files or []}
    if spec.script.entry not in files:
        shown = ", ".join(sorted(p for p in files if p.endswith(".py"))[:8]) or "none"
        msg = (
            f"the script's directory {spec.code} holds no {spec.script.entry} "
            f"(its Python files: {shown})"
        )
        raise InvalidSpec(f"script.entry: {msg}", errors=[{"loc": "script.entry", "msg": msg}])


def check_deliverable(spec: ExperimentSpec, settings: Settings) -> None:
    """InvalidSpec if the run's result could exceed what `complete` takes (max_result_bytes)."""
    estimate = result_size.result_bytes(spec)
    if estimate <= settings.max_result_bytes:
        return
    every = spec.training.fingerprint_every_steps
    loc = "training.fingerprint_every_steps" if every else "training.epochs"
    msg = (
        f"its result could reach {estimate} bytes ({result_size.trace_points(spec)} trace "
        f"points), past this server's limit of {settings.max_result_bytes} bytes for a "
        "result (REPRO_MAX_RESULT_BYTES): trace less often or train fewer steps"
    )
    raise InvalidSpec(f"spec exceeds limits: {loc}: {msg}", errors=[{"loc": loc, "msg": msg}])


def check_storable(spec: AnySpec) -> None:
    """InvalidSpec for text the database cannot store (PostgreSQL text refuses NUL)."""
    texts = {"name": spec.name, "environment.image": spec.environment.image}
    errors = [
        {"loc": loc, "msg": "must not contain NUL characters"}
        for loc, text in texts.items()
        if "\x00" in (text or "")
    ]
    if errors:
        raise InvalidSpec(f"invalid spec: {errors[0]['loc']}: {errors[0]['msg']}", errors=errors)


def check_limits(spec: ExperimentSpec, settings: Settings) -> None:
    """InvalidSpec if the spec asks for more work than this server's operator allows."""
    ds, tr = spec.dataset, spec.training
    checks = [
        ("training.epochs", tr.epochs, settings.max_epochs, "epochs"),
        ("dataset.batch_size", ds.batch_size, settings.max_batch_size, "samples per batch"),
        ("dataset.train_batches", ds.train_batches, settings.max_batches_per_epoch, "batches"),
        ("dataset.eval_batches", ds.eval_batches, settings.max_batches_per_epoch, "batches"),
        (
            "training.epochs",
            tr.epochs * ds.train_batches,
            settings.max_total_steps,
            "total steps (epochs x train_batches)",
        ),
    ]
    det, threads = spec.determinism, settings.max_threads
    for loc, asked in (
        ("determinism.intra_op_threads", det.intra_op_threads),
        ("determinism.inter_op_threads", det.inter_op_threads),
        ("dataset.num_parallel_calls", ds.num_parallel_calls),
    ):
        if isinstance(asked, int):  # None and "autotune" leave the choice to the worker
            checks.append((loc, asked, threads, "threads"))
    elements = registry.batch_elements(spec)
    if elements is not None:
        unit = "input values per batch (batch_size x sample size)"
        checks.append(("dataset.batch_size", elements, settings.max_batch_elements, unit))
    try:
        parameters = registry.parameter_count(spec)
    except ArchitectureError:
        parameters = None  # a model that cannot be built fails on the worker, saying why
    if parameters is not None:
        checks.append(("model", parameters, settings.max_model_parameters, "model parameters"))
    replicas = spec.distribution.replicas
    checks.append(("distribution.replicas", replicas, settings.max_replicas, "replicas"))
    errors = [
        {"loc": loc, "msg": f"{value} {unit} exceeds this server's limit of {limit}"}
        for loc, value, limit, unit in checks
        if value > limit
    ]
    if errors:
        detail = "; ".join(f"{e['loc']}: {e['msg']}" for e in errors)
        raise InvalidSpec(f"spec exceeds limits: {detail}", errors=errors)


def create_experiment(
    *,
    db: Session,
    spec: AnySpec,
    idempotency_key: str | None = None,
    request_hash: str | None = None,
    actor: Principal | None = None,
    copies: int = 1,
    settings: Settings,
    priority: int = 0,
    by_hand: bool = False,
) -> tuple[Experiment, Run, bool]:
    """Store the spec with its resolved seed and queue its first run (its claims come
    before lower `priority`; the caller checks who may set one).

    `by_hand`: the run is a script its user runs by hand, which reports its own result
    (`record_by_hand`): it starts running at once, and no worker claims it.

    With `copies` > 1 it queues that many runs at once as a reproducibility audit: one
    family whose copies go to different workers (the audit id is the first run's id).
    Returns (experiment, first run, created); a repeated idempotency key returns the
    original with created False, and a key reused for a different body raises Conflict.
    """
    if idempotency_key is not None:
        idempotency_key = scoped_idempotency_key(idempotency_key, actor)
        found = _by_idempotency_key(db, idempotency_key, request_hash)
        if found is not None:
            return found[0], found[1], False
    _require_stored_inputs(db, spec, settings)
    seed = resolve_seed(spec.seed)
    resolved = spec.with_seed(seed)
    experiment = Experiment(
        name=spec.name,
        spec=resolved.model_dump(mode="json"),
        spec_hash=resolved.spec_hash(),
        submitted_spec_hash=spec.spec_hash(),
        seed=list(seed),
        seed_source="spec" if spec.seed is not None else "generated",
        image=spec.environment.image,
        idempotency_key=idempotency_key,
        request_hash=request_hash,
        code_digest=spec.code,
        model_digest=None if isinstance(spec, ScriptExperimentSpec) else spec.model.definition,
    )
    queued = {"submitter_id": actor.token_id if actor is not None else None, "priority": priority}
    run = _queued_run(experiment, spec, **queued)
    if by_hand:
        run.status, run.origin, run.started_at = "running", "by_hand", utcnow()
    db.add_all([experiment, run])
    try:
        db.flush()
    except IntegrityError:
        # A concurrent request with the same key won the race: answer with its result.
        db.rollback()
        found = _by_idempotency_key(db, idempotency_key or "", request_hash)
        if found is None:
            raise
        return found[0], found[1], False
    run.family_id = run.id
    db.add_all(param_rows(experiment.id, experiment.spec))
    if copies > 1:
        run.audit_id = run.id
        db.add_all(
            _queued_run(
                experiment, spec, rerun_of_id=run.id, family_id=run.id, audit_id=run.id, **queued
            )
            for _ in range(copies - 1)
        )
    audit(
        db=db,
        actor=actor,
        action="experiment.record_by_hand" if by_hand else "experiment.submit",
        target_type="experiment",
        target_id=experiment.id,
        details={"run_id": run.id, "spec_hash": experiment.spec_hash, "copies": copies},
    )
    db.commit()
    return experiment, run, True


def _require_stored_inputs(db: Session, spec: AnySpec, settings: Settings) -> None:
    # Everything the spec names by digest must be held, usable and fit the model: a 422 now,
    # not a failed run later.
    if isinstance(spec, ScriptExperimentSpec):
        check_script(db, spec, settings)
        return
    datasets.require_held(db, spec.dataset.data)
    datasets.require_fit(db, spec)
    code_bundles.require_held(db, spec.code, settings)
    model_definitions.require_usable(db, spec, settings)


def _queued_run(experiment: Experiment, spec: AnySpec, **columns: int | None) -> Run:
    return Run(
        experiment=experiment,
        status="queued",
        required_image=spec.environment.image,
        required_hardware=spec.environment.hardware,
        replicas=1 if isinstance(spec, ScriptExperimentSpec) else spec.distribution.replicas,
        hosts=1 if isinstance(spec, ScriptExperimentSpec) else spec.distribution.hosts,
        needs_code=spec.code is not None,
        **columns,
    )


def scoped_idempotency_key(key: str, actor: Principal | None) -> str:
    """The stored form of a client's Idempotency-Key: one token's keys never meet another's."""
    owner = str(actor.token_id) if actor is not None else "server"
    return "sha256:" + hashlib.sha256(f"{owner}\0{key}".encode()).hexdigest()


def _by_idempotency_key(
    db: Session, key: str, request_hash: str | None
) -> tuple[Experiment, Run] | None:
    experiment = db.scalar(select(Experiment).where(Experiment.idempotency_key == key))
    if experiment is None:
        return None
    if request_hash is not None and experiment.request_hash != request_hash:
        raise Conflict("this Idempotency-Key was already used for a different request body")
    return experiment, experiment.runs[0]


def body_hash(body: bytes, content_type: str, copies: int = 1, priority: int = 0) -> str:
    """Digest identifying a submission for idempotency checks."""
    head = content_type.encode() + (f"\0copies={copies}".encode() if copies > 1 else b"")
    head += f"\0priority={priority}".encode() if priority else b""
    return hashlib.sha256(head + b"\0" + body).hexdigest()


def get_run(db: Session, run_id: int) -> Run:
    """The run, or NotFound."""
    run = db.get(Run, run_id)
    if run is None:
        raise NotFound(f"run {run_id} does not exist")
    return run


def get_experiment(db: Session, experiment_id: int) -> Experiment:
    """The experiment, or NotFound."""
    experiment = db.get(Experiment, experiment_id)
    if experiment is None:
        raise NotFound(f"experiment {experiment_id} does not exist")
    return experiment


def rerun(
    *,
    db: Session,
    run_id: int,
    settings: Settings,
    actor: Principal | None = None,
    priority: int = 0,
    on_worker: bool = False,
    hardware: str | None = None,
) -> Run:
    """A new queued run of the same experiment (same spec and seed; image pinned if known).
    A run recorded by hand is retrained on a worker only when asked to (`on_worker`): its
    environment was the user's machine, and the rerun's will be a worker's.

    The rerun requires its run's hardware class (or, for a run that recorded none, what
    the run required); `hardware` overrides that: "any", or a class or leading part of
    one. The override is kept on the rerun (`hardware_override`) and its comparison says it.
    """
    original = get_run(db, run_id)
    if original.kind != "train":
        raise Conflict(f"run {run_id} is a re-trace; rerun the run it re-traced")
    if original.origin == "by_hand" and not on_worker:
        raise Conflict(
            f"run {run_id} was run by hand, not by a worker: retrain it on a worker with "
            f"`repro rerun {run_id} --on-worker` (?on_worker=true); the comparison then "
            "names what differs between the two environments"
        )
    if original.status == "cancelled":
        raise Conflict(f"run {run_id} was cancelled; rerun a run that was not")
    spec = original.experiment.spec
    code = spec.get("code")
    # What it names may be archived (its runs rerun as before), not removed by retention.
    code_bundles.require_held(db, code, settings, new=False)
    try:
        # parse_spec: a stored spec past today's bounds is a SpecError, not a 500.
        parsed = parse_any_spec(spec)
        if isinstance(parsed, ScriptExperimentSpec):
            check_script(db, parsed, settings, new=False)
        else:
            with registry.bundled_components(code_bundles.entry_points_of(db, code), str(code)):
                registry.check_spec(parsed)
    except SpecError as exc:
        raise Conflict(f"the experiment of run {run_id} no longer validates: {exc}") from None
    datasets.require_held(db, (spec.get("dataset") or {}).get("data"), new=False)
    model_definitions.require_held(db, (spec.get("model") or {}).get("definition"), new=False)
    # Pin what the original actually ran on, so the rerun cannot silently change image.
    image = reported_image(original.provenance) or original.required_image
    pinned = recorded_hardware(original.provenance) or original.required_hardware
    if original.origin == "by_hand" and hardware is None:
        pinned = original.required_hardware  # the user's machine is no worker's class
    needs = pinned if hardware is None else (None if hardware == "any" else hardware)
    new = Run(
        experiment_id=original.experiment_id,
        rerun_of_id=original.id,
        family_id=original.family_id or original.id,
        status="queued",
        required_image=image,
        required_hardware=needs,
        hardware_override=hardware if hardware is not None and hardware != pinned else None,
        replicas=original.replicas,
        hosts=original.hosts,
        needs_code=code is not None,
        submitter_id=actor.token_id if actor is not None else None,
        priority=priority,
    )
    db.add(new)
    db.flush()
    audit(
        db=db,
        actor=actor,
        action="run.rerun",
        target_type="run",
        target_id=new.id,
        details={"rerun_of": original.id, "image": image, "hardware": needs},
    )
    db.commit()
    return new


def reported_image(provenance: dict[str, Any] | None) -> str | None:
    """The image a run reported running on, if it reported one: its image ID (the same on
    every host that holds the image), else its digest, else its reference."""
    recorded = (provenance or {}).get("image")
    if not isinstance(recorded, dict):
        return None
    found = [recorded.get(key) for key in ("id", "digest", "reference")]
    return next((value for value in found if isinstance(value, str) and value), None)


def recorded_hardware(provenance: dict[str, Any] | None) -> str | None:
    """The hardware class a run recorded training on, if it recorded one."""
    recorded = (provenance or {}).get("hardware")
    found = recorded.get("class") if isinstance(recorded, dict) else None
    return found if isinstance(found, str) and found else None


def cancel(*, db: Session, run_id: int, actor: Principal | None = None) -> Run:
    """Cancel a queued or running run; the worker holding it loses its lease."""
    run = get_run(db, run_id)
    if run.status not in ("queued", "running"):
        raise Conflict(f"run {run_id} is already {run.status}")
    run.status = "cancelled"
    run.lease_expires_at = None
    run.error = {"type": "Cancelled", "message": "cancelled by request"}
    run.finished_at = utcnow()
    audit(db=db, actor=actor, action="run.cancel", target_type="run", target_id=run.id)
    db.commit()
    resume_points.prune_step_checkpoints(db, run, keep_newest=False)  # it resumes no more
    if run.kind == "spot-check":  # its check is settled (as not settled) once all ended
        from service.verification import spot_checks  # it builds on this module

        spot_checks.settle_for(db, run)
    return run
