"""The training loop of one job: build, (resume,) train, trace, checkpoint, fingerprint data."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import keras
import numpy as np

from worker.errors import CheckpointError, SpecError
from worker.models import registry
from worker.models.model_size import check_parameter_limit
from worker.record import checkpoint as ckpt_io
from worker.record.fingerprint import StreamDigest, fingerprint_state
from worker.record.step_checkpoints import epoch_dataset, resume_within_epoch, save_step_checkpoint
from worker.record.trace import TracePoint
from worker.spec import ExperimentSpec
from worker.training import determinism
from worker.training.job import Job
from worker.training.progress import ProgressReporter
from worker.training.replicas import place_replicas
from worker.training.seeds import SeedTuple
from worker.training.step_loop import batches as _batches
from worker.training.step_loop import call_size, epoch_steps


@dataclass
class TrainingOutcome:
    """What a finished training run hands to the result document."""

    determinism: dict[str, Any]
    metrics: list[dict[str, Any]] = field(default_factory=list)
    trace: list[TracePoint] = field(default_factory=list)
    data_fingerprints: list[dict[str, Any]] = field(default_factory=list)
    eval_data_fingerprint: str | None = None
    checkpoints: list[str] = field(default_factory=list)
    resumed_from_epoch: int | None = None
    resumed_from_step: int | None = None  # global step of the checkpoint resumed from
    interrupted_after_epoch: int | None = None  # set when a stop request ended training early
    warnings: list[str] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)
    model: keras.Model | None = None  # the trained model, e.g. to export it


def _read(metrics: list[keras.metrics.Metric]) -> dict[str, float]:
    return {m.name: float(m.result()) for m in metrics}


def run_training(
    spec: ExperimentSpec,
    *,
    seed: SeedTuple,
    checkpoint_dir: Path | None,
    resume: bool,
    reporter: ProgressReporter,
    stop_requested: Callable[[int], bool] = lambda epoch: False,
    max_model_parameters: int | None = None,
    trace_every_steps: int | None = None,
    until_epoch: int | None = None,
    data: dict[str, np.ndarray] | None = None,
    allow_logical_devices: bool = True,
    steps_per_call: int | None = None,
    classic: bool = False,
) -> TrainingOutcome:
    """Train the experiment (resuming from the newest checkpoint if asked) and trace it.

    `stop_requested(epoch)` is asked after each epoch; when it says yes, training
    checkpoints that epoch and returns early with `interrupted_after_epoch` set.
    `trace_every_steps` overrides the spec's trace granularity and `until_epoch` ends
    training after that epoch (as finished, not interrupted): together they re-trace one
    stretch of a run step by step without changing its spec. If the model has a
    `training_callbacks` list of Keras callbacks (an architecture may attach one), they
    get `on_train_batch_end` after every step and `on_epoch_end` (Keras's 0-based epoch)
    before the epoch's trace point, with `step` and `epoch` (1-based) in their logs.
    `training.checkpoint_every_steps` adds step checkpoints, and resume takes the newest
    checkpoint of either kind. `distribution.replicas` > 1 trains data-parallel
    (`allow_logical_devices`: whether a GPU-less process may split its CPU into devices).
    Up to `steps_per_call` (default 1) steps run per compiled call, never across a trace
    point, step checkpoint or epoch end (one per call when the model has callbacks or the
    data must be fingerprinted as it is consumed). `classic` runs the loop as it was before several
    steps per call: one step per call, a dataset per epoch and TensorFlow reseeded every
    epoch, whatever the steps draw (slower; the same bits, which a test checks). `data` is the
    stored dataset's arrays (`dataset.data`), given to a generator factory that reads one.
    """
    t_start = time.monotonic()
    replicas = spec.distribution.replicas
    if spec.dataset.batch_size < replicas:
        msg = f"batch_size {spec.dataset.batch_size} cannot be split over {replicas} replicas"
        raise SpecError(msg, errors=[{"loc": "distribution.replicas", "msg": msg}])
    # Logical devices must be declared before TensorFlow starts its devices.
    placement = place_replicas(replicas, allow_logical_cpu=allow_logical_devices)
    if max_model_parameters is not None:
        # Built-in sizes are arithmetic on the spec: refuse before TensorFlow allocates anything.
        parameters = registry.parameter_count(spec)
        if parameters is not None:
            check_parameter_limit(parameters, max_model_parameters, how="computed from the spec")
            max_model_parameters = None
    record = determinism.apply(spec.determinism, seed)
    placement.start()
    if replicas > 1:  # a one-replica record stays as it always was
        record["distribution"] = placement.record()
    job = Job(spec, seed, max_model_parameters=max_model_parameters, data=data, placement=placement)
    out = TrainingOutcome(determinism=record, warnings=list(job.warnings))
    timings = {
        "setup": time.monotonic() - t_start,
        "training": 0.0,
        "fingerprinting": 0.0,
        "checkpointing": 0.0,
        "step_checkpointing": 0.0,  # the share of checkpointing spent on step checkpoints
        "train_calls": 0,  # compiled calls that ran the optimizer steps
    }
    tr = spec.training
    every = trace_every_steps or tr.fingerprint_every_steps
    last_epoch = min(tr.epochs, until_epoch or tr.epochs)
    callbacks = list(getattr(job.model, "training_callbacks", None) or [])
    for callback in callbacks:
        callback.set_model(job.model)
    steps_per_epoch = spec.dataset.train_batches
    spec_hash = spec.spec_hash()
    first_epoch, first_batch, step = 1, 0, 0
    step_every = tr.checkpoint_every_steps if checkpoint_dir is not None else None
    resumed_meta: dict[str, Any] | None = None
    # A stateless generator gives the same batches when an epoch is generated again, so its
    # data fingerprints are computed after training. A generator with stateful RNG ops does
    # not: its fingerprints are taken from the batches training actually consumed.
    in_loop_data = bool(job.data.stateful_random_ops)
    consumed: list[dict[str, Any]] = []
    # TensorFlow's global seed restarts stateful random ops' sequences; each epoch sets it
    # only if something could draw from them (it costs a re-optimisation of every step).
    step_rng = [] if classic or job.data.stateful_random_ops else job.stateful_random_ops()
    if step_rng:
        out.warnings.append(
            f"the model's training or evaluation step uses stateful RNG ops "
            f"({', '.join(step_rng)}): their seeds are fixed when the step is compiled, so a "
            "run resumed from a checkpoint draws other numbers than an uninterrupted one; "
            "use keras.random with a SeedGenerator, or tf.random.stateless_*"
        )
    tf_rng = job.data.stateful_random_ops + step_rng
    reseed_tf = classic or bool(tf_rng)
    record["reseed_tensorflow"] = (
        "every epoch" + (f" (stateful random ops: {', '.join(tf_rng)})" if tf_rng else "")
        if reseed_tf
        else "at start only: the compiled steps use no stateful random op"
    )

    if resume and checkpoint_dir is not None:
        ckpt, skipped = ckpt_io.load_latest(checkpoint_dir, spec_hash=spec_hash, replicas=replicas)
        out.warnings += skipped
        if ckpt is not None:
            ckpt_io.restore(ckpt, job.state)
            restored = fingerprint_state(job.state).fingerprint
            if restored != ckpt.meta["fingerprint"]:
                raise CheckpointError(
                    f"{ckpt.path.name}: restored state has fingerprint "
                    f"{restored}, expected {ckpt.meta['fingerprint']}"
                )
            step = ckpt.step
            out.trace = [TracePoint.model_validate(p) for p in ckpt.meta["trace"]]
            out.metrics = list(ckpt.meta["metrics"])
            out.checkpoints = list(ckpt.meta["checkpoints"])
            out.resumed_from_step = ckpt.step
            consumed = list(ckpt.meta.get("consumed_data_fingerprints", []))
            if ckpt.batch is None:
                first_epoch = ckpt.epoch + 1
                out.resumed_from_epoch = ckpt.epoch
                reporter.emit("resumed", epoch=ckpt.epoch, step=step, kind="epoch")
            else:  # mid-epoch: continue epoch `ckpt.epoch` at its next batch
                first_epoch, first_batch, resumed_meta = ckpt.epoch, ckpt.batch, ckpt.meta
                reporter.emit("resumed", epoch=ckpt.epoch, step=step, batch=ckpt.batch, kind="step")
    if not out.trace:
        out.trace.append(job.point("init", 0, 0))

    def steps_to_boundary(step: int) -> int:
        """Steps until the next trace point or step checkpoint (a call stops there)."""
        return min([n - step % n for n in (every, step_every) if n] or [steps_per_epoch])

    def checkpoint_meta(name: str, fingerprint: str) -> dict[str, Any]:
        return {
            "spec_hash": spec_hash,
            "seed": list(seed),
            "replicas": replicas,
            "fingerprint": fingerprint,
            "trace": [p.model_dump() for p in out.trace],
            "metrics": out.metrics,
            "checkpoints": [*out.checkpoints, name],
            "consumed_data_fingerprints": consumed,
        }

    # Batches that can be regenerated and come in order are read from one pipeline for the
    # whole run, traced and started once: a dataset per epoch cost a small CNN's job about
    # a sixth of each epoch. Epoch by epoch otherwise, as the classic loop always does.
    one_pipeline = not (classic or in_loop_data) and bool(
        job.data.deterministic_order or not job.data.num_parallel_calls
    )
    run_batches: Any = None
    eval_dataset = None
    if job.eval_data is not None and not job.eval_data.stateful_random_ops:
        eval_dataset = job.eval_data.as_dataset()  # the same batches every epoch
    # Checkpoints count once renamed into place; their fsyncs run beside training.
    syncer = ckpt_io.Syncer()
    for epoch in range(first_epoch, last_epoch + 1):
        t_epoch = time.monotonic()
        determinism.reseed(seed, "epoch", epoch, tensorflow=reseed_tf)
        for metric in job.train_metrics + job.eval_metrics:
            metric.reset_state()
        start = first_batch if epoch == first_epoch else 0
        if start and resumed_meta is not None:
            resume_within_epoch(resumed_meta, job.train_metrics)
            if in_loop_data:
                out.warnings.append(
                    f"the data fingerprint of epoch {epoch} covers only batches {start + 1}.. "
                    "(training resumed mid-epoch on data that cannot be regenerated)"
                )
        reporter.emit("epoch_start", epoch=epoch, epochs=tr.epochs)
        data_digest = StreamDigest() if in_loop_data else None
        if not one_pipeline:
            iterator = iter(epoch_dataset(job.data, epoch, start))
        else:
            if run_batches is None:
                run_batches = iter(job.data.epochs_dataset(epoch, last_epoch, start))
            iterator = run_batches
        for batch_in_epoch, global_step, loss in epoch_steps(
            iterator=iterator,
            generator=job.data.name,
            single=job.train_step,
            multi=None if (callbacks or in_loop_data) else job.multi_step,
            first_batch=start,
            num_batches=steps_per_epoch,
            step=step,
            steps_to_boundary=steps_to_boundary,
            steps_per_call=1
            if classic
            else call_size([every, step_every, steps_per_epoch], steps_per_call or 1),
            digest=data_digest,
        ):
            step = global_step
            timings["train_calls"] += 1
            if reporter.step_due():
                reporter.step(
                    epoch=epoch,
                    epochs=tr.epochs,
                    batch=batch_in_epoch,
                    batches=steps_per_epoch,
                    step=step,
                    loss=float(loss),
                )
            for callback in callbacks:
                callback.on_train_batch_end(batch_in_epoch - 1, {"step": step, "epoch": epoch})
            if every and step % every == 0:
                t_fp = time.monotonic()
                out.trace.append(job.point("step", epoch, step))
                timings["fingerprinting"] += time.monotonic() - t_fp
            if step_every and checkpoint_dir is not None and step % step_every == 0:
                t_ck = time.monotonic()
                name = save_step_checkpoint(
                    checkpoint_dir,
                    state=job.state,
                    meta=checkpoint_meta,
                    last_point=out.trace[-1],
                    position=(epoch, batch_in_epoch, step),
                    train_metrics=job.train_metrics,
                    syncer=syncer,
                )
                out.checkpoints.append(name)
                timings["checkpointing"] += time.monotonic() - t_ck
                timings["step_checkpointing"] += time.monotonic() - t_ck
                reporter.emit(
                    "checkpoint",
                    epoch=epoch,
                    step=step,
                    batch=batch_in_epoch,
                    path=name,
                    kind="step",
                )
        if data_digest is not None:
            consumed.append({"epoch": epoch, "fingerprint": data_digest.hexdigest()})
        row: dict[str, Any] = {"epoch": epoch, "step": step, **_read(job.train_metrics)}
        if job.eval_data is not None:
            for x, y in _batches(
                eval_dataset if eval_dataset is not None else job.eval_data.as_dataset(),
                job.data.name,
            ):
                job.eval_step(x, y)
            row.update(_read(job.eval_metrics))
        for callback in callbacks:
            callback.on_epoch_end(epoch - 1, {"step": step, "epoch": epoch})
        t_fp = time.monotonic()
        out.trace.append(job.point("epoch", epoch, step))
        timings["fingerprinting"] += time.monotonic() - t_fp
        row["seconds"] = round(time.monotonic() - t_epoch, 6)
        out.metrics.append(row)
        reporter.emit("epoch_end", **row, fingerprint=out.trace[-1].fingerprint)
        stopping = epoch < last_epoch and stop_requested(epoch)
        if checkpoint_dir is not None and (
            epoch % tr.checkpoint_every_epochs == 0 or epoch == last_epoch or stopping
        ):
            t_ck = time.monotonic()
            name = f"epoch-{epoch:06d}.json"
            meta = checkpoint_meta(name, out.trace[-1].fingerprint)
            ckpt_io.save_checkpoint(
                checkpoint_dir, epoch=epoch, step=step, state=job.state, meta=meta, syncer=syncer
            )
            out.checkpoints.append(name)
            timings["checkpointing"] += time.monotonic() - t_ck
            reporter.emit("checkpoint", epoch=epoch, step=step, path=name)
        timings["training"] += time.monotonic() - t_epoch
        if stopping:
            out.interrupted_after_epoch = epoch
            reporter.emit("interrupted", epoch=epoch, step=step)
            break
    t_ck = time.monotonic()
    syncer.close()  # the job reports success only with its checkpoints on disk
    timings["checkpointing"] += time.monotonic() - t_ck

    # Data fingerprints regenerate each epoch's batches: cheap, and off the hot loop.
    t_data = time.monotonic()
    out.data_fingerprints = (
        consumed
        if in_loop_data
        else [
            {"epoch": e, "fingerprint": job.data.for_epoch(e).data_fingerprint()}
            for e in range(1, (out.interrupted_after_epoch or last_epoch) + 1)
        ]
    )
    if job.eval_data is not None:
        out.eval_data_fingerprint = job.eval_data.data_fingerprint()
    timings["data_fingerprints"] = time.monotonic() - t_data
    out.timings = {k: round(v, 6) for k, v in timings.items()}
    out.model = job.model
    return out
