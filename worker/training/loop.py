"""The training loop of one job: build, (resume,) train, trace, checkpoint, fingerprint data."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from worker.data.stateless_dataset import StatelessRngDataset
from worker.errors import CheckpointError, SpecError
from worker.models import registry
from worker.models.model_size import check_parameter_limit
from worker.record import checkpoint as ckpt_io
from worker.record.fingerprint import StreamDigest, fingerprint_state
from worker.record.step_checkpoints import epoch_dataset, resume_within_epoch, save_step_checkpoint
from worker.record.trace import TracePoint
from worker.result import step_bucket_size
from worker.spec import ExperimentSpec
from worker.training import determinism, preflight
from worker.training.cluster import ClusterError, lost_member, this_host
from worker.training.job import Job
from worker.training.options import TrainingOptions
from worker.training.progress import ProgressReporter
from worker.training.replicas import place_replicas
from worker.training.seeds import SeedTuple
from worker.training.step_loop import batches as _batches
from worker.training.step_loop import epoch_steps


@dataclass
class TrainingOutcome:
    """What a finished training run hands to the result document."""

    determinism: dict[str, Any]
    metrics: list[dict[str, Any]] = field(default_factory=list)
    step_metrics: list[dict[str, Any]] = field(default_factory=list)  # the loss every k steps
    trace: list[TracePoint] = field(default_factory=list)
    data_fingerprints: list[dict[str, Any]] = field(default_factory=list)
    eval_data_fingerprint: str | None = None
    checkpoints: list[str] = field(default_factory=list)
    resumed_from_epoch: int | None = None
    resumed_from_step: int | None = None  # global step of the checkpoint resumed from
    interrupted_after_epoch: int | None = None  # set when a stop request ended training early
    interrupted_at_step: int | None = None  # ... mid-epoch, with a step checkpoint there
    stopped_at_step: int | None = None  # set when training ended mid-epoch at `until_step`
    warnings: list[str] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)
    model: keras.Model | None = None  # the trained model, e.g. to export it

    @property
    def interrupted(self) -> bool:
        """Whether a stop request ended training before its last epoch."""
        return self.interrupted_after_epoch is not None or self.interrupted_at_step is not None


def _read(metrics: list[keras.metrics.Metric]) -> dict[str, float]:
    return {m.name: float(m.result()) for m in metrics}


def run_training(
    spec: ExperimentSpec,
    *,
    seed: SeedTuple,
    reporter: ProgressReporter,
    options: TrainingOptions,
    data: dict[str, np.ndarray] | None = None,
    model_definition: bytes | None = None,
) -> TrainingOutcome:
    """Train the experiment (resuming from the newest checkpoint if asked) and trace it.

    If the model has a `training_callbacks` list of Keras callbacks (an architecture may
    attach one), they get `on_train_batch_end` after every step and `on_epoch_end` (Keras's
    0-based epoch) before the epoch's trace point, with `step` and `epoch` (1-based) in their
    logs. `training.checkpoint_every_steps` adds step checkpoints, and resume takes the newest
    checkpoint of either kind. `distribution.replicas` > 1 trains data-parallel. `data` is the
    stored dataset's arrays (`dataset.data`), given to a generator factory that reads one;
    `model_definition` the bytes of the stored model definition (`model.definition`).
    """
    try:
        return _run_training(
            spec,
            seed=seed,
            reporter=reporter,
            options=options,
            data=data,
            model_definition=model_definition,
        )
    except (
        tf.errors.UnavailableError,
        tf.errors.AbortedError,
        tf.errors.CancelledError,
        tf.errors.DeadlineExceededError,
    ) as exc:
        if spec.distribution.hosts == 1:
            raise
        raise ClusterError(lost_member(exc.message)) from None


def _run_training(
    spec: ExperimentSpec,
    *,
    seed: SeedTuple,
    reporter: ProgressReporter,
    options: TrainingOptions,
    data: dict[str, np.ndarray] | None,
    model_definition: bytes | None,
) -> TrainingOutcome:
    t_start = time.monotonic()
    job, record = _set_up(
        spec, seed=seed, options=options, data=data, model_definition=model_definition
    )
    out = TrainingOutcome(determinism=record, warnings=list(job.warnings))
    training = _Training(
        spec,
        seed=seed,
        job=job,
        out=out,
        reporter=reporter,
        options=options,
        setup_seconds=time.monotonic() - t_start,
    )
    training.resume()
    training.train()
    return training.finish()


def _set_up(
    spec: ExperimentSpec,
    *,
    seed: SeedTuple,
    options: TrainingOptions,
    data: dict[str, np.ndarray] | None,
    model_definition: bytes | None = None,
) -> tuple[Job, dict[str, Any]]:
    """Place the replicas, apply determinism and build the job; (job, determinism record)."""
    replicas = spec.distribution.replicas
    if spec.dataset.batch_size < replicas:
        msg = f"batch_size {spec.dataset.batch_size} cannot be split over {replicas} replicas"
        raise SpecError(msg, errors=[{"loc": "distribution.replicas", "msg": msg}])
    host = this_host(spec.distribution.hosts)
    # Logical devices must be declared before TensorFlow starts its devices.
    placement = place_replicas(
        replicas, allow_logical_cpu=options.allow_logical_devices, hosts=host.hosts, rank=host.rank
    )
    max_model_parameters = options.max_model_parameters
    if max_model_parameters is not None:
        # Built-in sizes are arithmetic on the spec: refuse before TensorFlow allocates anything.
        parameters = registry.parameter_count(spec)
        if parameters is not None:
            check_parameter_limit(parameters, max_model_parameters, how="computed from the spec")
            max_model_parameters = None
    record = determinism.apply(spec.determinism, seed)
    placement.start()  # several hosts: joins the cluster, waiting for every member
    options.joined()
    if placement.total_replicas > 1:  # a one-replica record stays as it always was
        record["distribution"] = placement.record()
    job = Job(
        spec,
        seed,
        max_model_parameters=max_model_parameters,
        max_activation_elements=options.max_activation_elements,
        data=data,
        placement=placement,
        model_definition=model_definition,
    )
    if spec.determinism.op_determinism:
        # An op without a deterministic kernel fails here, named, not in the first epoch.
        preflight.check_steps(job)
    return job, record


class _Pipelines:
    """Where each epoch's training batches, and the evaluation batches, come from."""

    def __init__(self, job: Job, *, one_pipeline: bool, last_epoch: int) -> None:
        self._data = job.data
        self._one_pipeline = one_pipeline
        self._last_epoch = last_epoch
        self._run: Any = None
        self._eval: tf.data.Dataset | None = None
        if job.eval_data is not None and not job.eval_data.stateful_random_ops:
            self._eval = job.eval_data.as_dataset()  # the same batches every epoch

    def train(self, epoch: int, first_batch: int) -> Any:
        """An iterator over epoch `epoch`'s batches from `first_batch` on."""
        if not self._one_pipeline:
            return iter(epoch_dataset(self._data, epoch, first_batch))
        if self._run is None:
            self._run = iter(self._data.epochs_dataset(epoch, self._last_epoch, first_batch))
        return self._run

    def evaluation(self, eval_data: StatelessRngDataset) -> tf.data.Dataset:
        """The evaluation batches of this epoch."""
        return self._eval if self._eval is not None else eval_data.as_dataset()


class _Training:
    """One job's training once it is set up: the state its steps share, epoch to epoch."""

    syncer: ckpt_io.Syncer  # set when training starts

    def __init__(
        self,
        spec: ExperimentSpec,
        *,
        seed: SeedTuple,
        job: Job,
        out: TrainingOutcome,
        reporter: ProgressReporter,
        options: TrainingOptions,
        setup_seconds: float,
    ) -> None:
        self.spec, self.seed, self.job, self.out = spec, seed, job, out
        self.reporter, self.options = reporter, options
        self.timings: dict[str, float] = {
            "setup": setup_seconds,
            "training": 0.0,
            "fingerprinting": 0.0,
            "checkpointing": 0.0,
            "step_checkpointing": 0.0,  # the share of checkpointing spent on step checkpoints
            "train_calls": 0,  # compiled calls that ran the optimizer steps
        }
        tr = spec.training
        self.every = options.trace_every_steps or tr.fingerprint_every_steps
        self.last_epoch = min(tr.epochs, options.until_epoch or tr.epochs)
        self.until_step = options.until_step
        if self.until_step is not None:  # the epoch it falls in is the last one begun
            self.last_epoch = min(
                self.last_epoch, -(-self.until_step // spec.dataset.train_batches)
            )
        self.callbacks = list(getattr(job.model, "training_callbacks", None) or [])
        for callback in self.callbacks:
            callback.set_model(job.model)
        self.steps_per_epoch = spec.dataset.train_batches
        # A per-step row in each bucket of this many steps (the first call that enters it).
        self.step_bucket = step_bucket_size(tr.epochs * self.steps_per_epoch)
        self.spec_hash = spec.spec_hash()
        self.first_epoch, self.first_batch, self.step = 1, 0, 0
        self.checkpoint_dir = options.checkpoint_dir
        # Of several hosts, rank 0 alone writes checkpoints and fingerprints the data: every
        # host holds the same model and optimizer state, and reads it without collectives.
        self.writes_checkpoints = job.placement.rank == 0
        self.step_every = tr.checkpoint_every_steps if self.checkpoint_dir is not None else None
        self.resumed_meta: dict[str, Any] | None = None
        # A generator with stateful RNG ops gives other batches when an epoch is generated
        # again: its fingerprints can only come from the batches training consumed.
        self.in_loop_data = bool(job.data.stateful_random_ops)
        self.consumed: list[dict[str, Any]] = []
        self.eval_digest: str | None = None  # the held-out batches' fingerprint, as read
        self.reseed_tf = self._reseed_policy()
        self.steps_per_call = self._steps_per_call_policy()
        # Stateless batches are digested as consumed too (the values generating an epoch
        # again gives), which spares `finish` generating every epoch again. The classic loop
        # still does that, as jobs once did: a test holds the two ways to the same values.
        fresh = not options.classic
        self.digest_consumed = self.in_loop_data or (fresh and job.digests_batches)
        self.digest_eval = fresh and job.digests_eval

    def _reseed_policy(self) -> bool:
        """Whether each epoch reseeds TensorFlow (recorded, with a warning for compiled RNG)."""
        classic, job = self.options.classic, self.job
        # TensorFlow's global seed restarts stateful random ops' sequences; each epoch sets it
        # only if something could draw from them (it costs a re-optimisation of every step).
        step_rng = [] if classic or job.data.stateful_random_ops else job.stateful_random_ops()
        if step_rng:
            self.out.warnings.append(
                f"the model's training or evaluation step uses stateful RNG ops "
                f"({', '.join(step_rng)}): their seeds are fixed when the step is compiled, so a "
                "run resumed from a checkpoint draws other numbers than an uninterrupted one; "
                "use keras.random with a SeedGenerator, or tf.random.stateless_*"
            )
        tf_rng = job.data.stateful_random_ops + step_rng
        reseed_tf = classic or bool(tf_rng)
        self.out.determinism["reseed_tensorflow"] = (
            "every epoch" + (f" (stateful random ops: {', '.join(tf_rng)})" if tf_rng else "")
            if reseed_tf
            else "at start only: the compiled steps use no stateful random op"
        )
        return reseed_tf

    def resume(self) -> None:
        """Continue from the newest intact checkpoint if asked; a fresh trace starts at init."""
        if self.options.resume and self.checkpoint_dir is not None:
            self._restore(self.checkpoint_dir)
        if not self.out.trace:
            self.out.trace.append(self.job.point("init", 0, 0))

    def _restore(self, directory: Path) -> None:
        out, replicas = self.out, self.spec.distribution.replicas
        ckpt, skipped = ckpt_io.load_latest(directory, spec_hash=self.spec_hash, replicas=replicas)
        out.warnings += skipped
        if ckpt is None:
            return
        ckpt_io.restore(ckpt, self.job.state)
        restored = fingerprint_state(self.job.state).fingerprint
        if restored != ckpt.meta["fingerprint"]:
            raise CheckpointError(
                f"{ckpt.path.name}: restored state has fingerprint "
                f"{restored}, expected {ckpt.meta['fingerprint']}"
            )
        self.step = step = ckpt.step
        out.trace = [TracePoint.model_validate(p) for p in ckpt.meta["trace"]]
        out.metrics = list(ckpt.meta["metrics"])
        out.step_metrics = list(ckpt.meta.get("step_metrics", []))
        out.checkpoints = list(ckpt.meta["checkpoints"])
        out.resumed_from_step = ckpt.step
        self.consumed = list(ckpt.meta.get("consumed_data_fingerprints", []))
        if ckpt.batch is None:
            self.first_epoch = ckpt.epoch + 1
            out.resumed_from_epoch = ckpt.epoch
            self.reporter.emit("resumed", epoch=ckpt.epoch, step=step, kind="epoch")
        else:  # mid-epoch: continue epoch `ckpt.epoch` at its next batch
            self.first_epoch, self.first_batch = ckpt.epoch, ckpt.batch
            self.resumed_meta = ckpt.meta
            self.reporter.emit(
                "resumed", epoch=ckpt.epoch, step=step, batch=ckpt.batch, kind="step"
            )

    def train(self) -> None:
        """Train the epochs left, up to the last one or a stop request."""
        job = self.job
        # Batches that can be regenerated and come in order are read from one pipeline for the
        # whole run, traced and started once: a dataset per epoch cost a small CNN's job about
        # a sixth of each epoch. Epoch by epoch otherwise, as the classic loop always does.
        one_pipeline = not (self.options.classic or self.in_loop_data) and bool(
            job.data.deterministic_order or not job.data.num_parallel_calls
        )
        pipelines = _Pipelines(job, one_pipeline=one_pipeline, last_epoch=self.last_epoch)
        # Checkpoints count once renamed into place; their fsyncs run beside training.
        self.syncer = ckpt_io.Syncer()
        for epoch in range(self.first_epoch, self.last_epoch + 1):
            t_epoch = time.monotonic()
            self._train_epoch(epoch, pipelines)
            if self._stopped_mid_epoch(epoch):
                self.timings["training"] += time.monotonic() - t_epoch
                break
            if self._interrupted_mid_epoch(epoch):
                self.timings["training"] += time.monotonic() - t_epoch
                self.reporter.emit("interrupted", epoch=epoch, step=self.step)
                break
            row = self._epoch_row(epoch, pipelines)
            stopping = self._end_epoch(epoch, row, t_epoch)
            self.timings["training"] += time.monotonic() - t_epoch
            if stopping:
                self.out.interrupted_after_epoch = epoch
                self.reporter.emit("interrupted", epoch=epoch, step=self.step)
                break
        t_ck = time.monotonic()
        self.syncer.close()  # the job reports success only with its checkpoints on disk
        self.timings["checkpointing"] += time.monotonic() - t_ck

    def _train_epoch(self, epoch: int, pipelines: _Pipelines) -> None:
        """Run the epoch's optimizer steps, with their trace points and step checkpoints."""
        job = self.job
        determinism.reseed(self.seed, "epoch", epoch, tensorflow=self.reseed_tf)
        for metric in job.train_metrics + job.eval_metrics:
            metric.reset_state()
        start = self.first_batch if epoch == self.first_epoch else 0
        if start and self.resumed_meta is not None:
            resume_within_epoch(self.resumed_meta, job.train_metrics)
            if self.in_loop_data:
                self.out.warnings.append(
                    f"the data fingerprint of epoch {epoch} covers only batches {start + 1}.. "
                    "(training resumed mid-epoch on data that cannot be regenerated)"
                )
        self.reporter.emit("epoch_start", epoch=epoch, epochs=self.spec.training.epochs)
        data_digest = StreamDigest() if self.digest_consumed else None
        iterator = pipelines.train(epoch, start)
        for batch_in_epoch, global_step, loss in epoch_steps(
            iterator=iterator,
            generator=job.data.name,
            single=job.train_step,
            looped=job.looped_steps if self.steps_per_call > 1 else None,
            first_batch=start,
            num_batches=self.steps_per_epoch,
            step=self.step,
            steps_to_boundary=self._steps_to_boundary,
            steps_per_call=self.steps_per_call,
            digest=data_digest,
        ):
            self.step = global_step
            self._after_call(epoch, batch_in_epoch, loss)
            if self.until_step is not None and self.step >= self.until_step:
                break
            if self._stop_now(epoch):
                break
        # A stateless epoch resumed or stopped mid-way is fingerprinted whole by `finish`.
        whole = self.step == epoch * self.steps_per_epoch
        if data_digest is not None and (self.in_loop_data or (start == 0 and whole)):
            self.consumed.append({"epoch": epoch, "fingerprint": data_digest.hexdigest()})

    def _stopped_mid_epoch(self, epoch: int) -> bool:
        """Whether training stopped at `until_step` inside `epoch`; then its trace ends with
        a point at that step and, with a checkpoint directory, a checkpoint there."""
        if self.until_step is None or self.step != self.until_step:
            return False
        if self.step == epoch * self.steps_per_epoch:
            return False  # the epoch's end: it ends as any epoch does
        if self.out.trace[-1].step != self.step:
            self.out.trace.append(self.job.point("step", epoch, self.step))
        named = f"{ckpt_io.step_stem(self.step)}.json"
        if self.checkpoint_dir is not None and named not in self.out.checkpoints:
            self._step_checkpoint(
                self.checkpoint_dir, epoch, self.step - (epoch - 1) * self.steps_per_epoch
            )
        self.out.stopped_at_step = self.step
        return True

    def _stop_now(self, epoch: int) -> bool:
        """Whether a stop request ends training after this call, mid-epoch: only with a
        checkpoint directory to resume from (else it ends at the epoch's end, as ever), and
        on data that can be generated again (a stateful generator's epoch resumed mid-way
        would be fingerprinted in part)."""
        return (
            self.checkpoint_dir is not None
            and not self.in_loop_data
            and self.step < epoch * self.steps_per_epoch
            and self.options.stop_now()
        )

    def _interrupted_mid_epoch(self, epoch: int) -> bool:
        """Whether a stop request ended `epoch` early; then a step checkpoint holds where.
        No trace point is added: the resumed run's trace is the uninterrupted one's."""
        if self.checkpoint_dir is None or self.step >= epoch * self.steps_per_epoch:
            return False
        if self.until_step is not None and self.step >= self.until_step:
            return False
        if f"{ckpt_io.step_stem(self.step)}.json" not in self.out.checkpoints:
            self._step_checkpoint(
                self.checkpoint_dir, epoch, self.step - (epoch - 1) * self.steps_per_epoch
            )
        self.out.interrupted_at_step = self.step
        return True

    def _steps_per_call_policy(self) -> int:
        """The spec's steps per call, or 1 (with a warning) where steps need Python between them."""
        n, why = self.job.steps_per_call()
        if why is not None:
            self.out.warnings.append(
                f"training.steps_per_execution {self.spec.training.steps_per_execution} "
                f"ran as 1 step per call: {why}"
            )
        return n

    def _steps_to_boundary(self, step: int) -> int:
        """Steps until the next trace point or step checkpoint (a call stops there)."""
        until = [self.until_step - step] if self.until_step and self.until_step > step else []
        return min(
            [n - step % n for n in (self.every, self.step_every) if n] + until
            or [self.steps_per_epoch]
        )

    def _after_call(self, epoch: int, batch_in_epoch: int, loss: Any) -> None:
        """Report the step, call the callbacks, then take a due trace point and step checkpoint."""
        step, every, step_every = self.step, self.every, self.step_every
        self.timings["train_calls"] += 1
        if self.reporter.step_due():
            self.reporter.step(
                epoch=epoch,
                epochs=self.spec.training.epochs,
                batch=batch_in_epoch,
                batches=self.steps_per_epoch,
                step=step,
                loss=float(loss),
            )
        for callback in self.callbacks:
            callback.on_train_batch_end(batch_in_epoch - 1, {"step": step, "epoch": epoch})
        rows = self.out.step_metrics
        bucket = (step - 1) // self.step_bucket  # steps 1..T: at most MAX_STEP_POINTS buckets
        if not rows or bucket > (rows[-1]["step"] - 1) // self.step_bucket:
            value = float(loss)
            if math.isfinite(value):  # a curve has no point for a NaN; the epoch row says so
                rows.append({"epoch": epoch, "step": step, "loss": value})
        if every and step % every == 0:
            t_fp = time.monotonic()
            self.out.trace.append(self.job.point("step", epoch, step))
            self.timings["fingerprinting"] += time.monotonic() - t_fp
        if step_every and self.checkpoint_dir is not None and step % step_every == 0:
            self._step_checkpoint(self.checkpoint_dir, epoch, batch_in_epoch)

    def _step_checkpoint(self, directory: Path, epoch: int, batch_in_epoch: int) -> None:
        if not self.writes_checkpoints:
            return
        t_ck = time.monotonic()
        name = save_step_checkpoint(
            directory,
            state=self.job.state,
            meta=self._checkpoint_meta,
            last_point=self.out.trace[-1],
            position=(epoch, batch_in_epoch, self.step),
            train_metrics=self.job.train_metrics,
            syncer=self.syncer,
        )
        self.out.checkpoints.append(name)
        self.timings["checkpointing"] += time.monotonic() - t_ck
        self.timings["step_checkpointing"] += time.monotonic() - t_ck
        self.reporter.emit(
            "checkpoint", epoch=epoch, step=self.step, batch=batch_in_epoch, path=name, kind="step"
        )

    def _checkpoint_meta(self, name: str, fingerprint: str) -> dict[str, Any]:
        return {
            "spec_hash": self.spec_hash,
            "seed": list(self.seed),
            "replicas": self.spec.distribution.replicas,
            "fingerprint": fingerprint,
            "trace": [p.model_dump() for p in self.out.trace],
            "metrics": self.out.metrics,
            "step_metrics": self.out.step_metrics,
            "checkpoints": [*self.out.checkpoints, name],
            "consumed_data_fingerprints": self.consumed,
        }

    def _epoch_row(self, epoch: int, pipelines: _Pipelines) -> dict[str, Any]:
        """The epoch's metrics row: its training metrics, then an evaluation's if there is one."""
        job = self.job
        row: dict[str, Any] = {"epoch": epoch, "step": self.step, **_read(job.train_metrics)}
        if job.eval_data is not None:
            # The held-out batches are the same every epoch: the first evaluation digests
            # them as it reads them, so `finish` need not generate them again.
            digest = StreamDigest() if self.eval_digest is None and self.digest_eval else None
            for i, (x, y) in enumerate(
                _batches(pipelines.evaluation(job.eval_data), job.data.name)
            ):
                if digest is not None:
                    digest.add_batch(i, (x, y))
                job.eval_step(x, y)
            if digest is not None:
                self.eval_digest = digest.hexdigest()
            row.update(_read(job.eval_metrics))
        return row

    def _end_epoch(self, epoch: int, row: dict[str, Any], t_epoch: float) -> bool:
        """Trace, report and checkpoint the epoch's end; whether a stop request ends training."""
        out, step = self.out, self.step
        for callback in self.callbacks:
            callback.on_epoch_end(epoch - 1, {"step": step, "epoch": epoch})
        t_fp = time.monotonic()
        out.trace.append(self.job.point("epoch", epoch, step))
        self.timings["fingerprinting"] += time.monotonic() - t_fp
        row["seconds"] = round(time.monotonic() - t_epoch, 6)
        out.metrics.append(row)
        self.reporter.emit("epoch_end", **row, fingerprint=out.trace[-1].fingerprint)
        stopping = epoch < self.last_epoch and self.options.stop_requested(epoch)
        if self.checkpoint_dir is not None and (
            epoch % self.spec.training.checkpoint_every_epochs == 0
            or epoch == self.last_epoch
            or stopping
        ):
            self._epoch_checkpoint(self.checkpoint_dir, epoch)
        return stopping

    def _epoch_checkpoint(self, directory: Path, epoch: int) -> None:
        if not self.writes_checkpoints:
            return
        t_ck = time.monotonic()
        name = f"epoch-{epoch:06d}.json"
        meta = self._checkpoint_meta(name, self.out.trace[-1].fingerprint)
        ckpt_io.save_checkpoint(
            directory,
            epoch=epoch,
            step=self.step,
            state=self.job.state,
            meta=meta,
            syncer=self.syncer,
        )
        self.out.checkpoints.append(name)
        self.timings["checkpointing"] += time.monotonic() - t_ck
        self.reporter.emit("checkpoint", epoch=epoch, step=self.step, path=name)

    def _data_fingerprints(self) -> list[dict[str, Any]]:
        """Each trained epoch's data fingerprint: as consumed, or by regenerating the epochs
        whose batches training did not see whole (calls of several steps, a resume)."""
        if self.out.interrupted_at_step is not None:  # the epochs trained whole
            last = (self.out.interrupted_at_step - 1) // self.steps_per_epoch
        else:
            last = self.out.interrupted_after_epoch or self.last_epoch
        known = {c["epoch"]: c["fingerprint"] for c in self.consumed}
        missing = [e for e in range(1, last + 1) if e not in known]
        if missing:
            first = min(missing)
            # Whole batches, also on a host that trained on its own rows of them.
            whole = self.job.data.with_options(own_shards=None)
            fingerprints = whole.epochs_data_fingerprints(first, max(missing))
            known.update((e, fp) for e, fp in enumerate(fingerprints, start=first) if e in missing)
        return [{"epoch": e, "fingerprint": known[e]} for e in range(1, last + 1)]

    def finish(self) -> TrainingOutcome:
        """Fingerprint the data trained and evaluated on and hand over the outcome."""
        out, job = self.out, self.job
        # Data fingerprints: as consumed, else regenerated from one pipeline after training.
        t_data = time.monotonic()
        if not self.writes_checkpoints:
            out.data_fingerprints = []  # rank 0's result is the run's
        elif self.in_loop_data:
            out.data_fingerprints = self.consumed
        else:
            out.data_fingerprints = self._data_fingerprints()
        if job.eval_data is not None:
            out.eval_data_fingerprint = self.eval_digest or job.eval_data.data_fingerprint()
        self.timings["data_fingerprints"] = time.monotonic() - t_data
        self.timings["traces"] = job.trace_count()
        out.timings = {k: round(v, 6) for k, v in self.timings.items()}
        out.model = job.model
        return out
