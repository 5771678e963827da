"""One experiment's model, optimizer, data and compiled steps, built from its spec, and
the model-size check made before any weight is allocated."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from worker.data.batch_source import BatchSource, DataInfo
from worker.data.job_data import build_job_data
from worker.data.stateless_dataset import StatelessRngDataset, stateful_random_ops_in
from worker.errors import ArchitectureError, GeneratorError
from worker.models import registry
from worker.models.keras_definition import (
    DefinitionInfo,
    DefinitionRefused,
    check_activations,
    read_definition,
)
from worker.models.model_size import check_parameter_limit
from worker.record.fingerprint import fingerprint_state
from worker.record.trace import PointKind, TracePoint
from worker.record.variable_reads import training_state
from worker.spec import ExperimentSpec
from worker.training import determinism
from worker.training.cluster import Host, own_shards
from worker.training.losses import loss_maker
from worker.training.mirrored_steps import MirroredSteps
from worker.training.replicas import Placement
from worker.training.seeds import SeedTuple
from worker.training.step_loop import LoopedSteps, is_xy_pair
from worker.training.step_loop import xy as _xy


def _data_info(data: StatelessRngDataset, source: BatchSource) -> DataInfo:
    x, y = _xy(data.make_batch(0), data.name)
    for what, t in (("x", x), ("y", y)):
        if t.shape.rank == 0 or t.shape[0] != data.rows:
            whose = "" if data.rows == data.batch_size else " (this host's rows of it)"
            raise GeneratorError(
                data.name,
                f"{what} has shape {t.shape}; its first dimension must be the "
                f"batch size {data.rows}{whose}",
            )
    return DataInfo(
        x_shape=tuple(int(d) for d in x.shape[1:]),
        x_dtype=x.dtype.name,
        y_shape=tuple(int(d) for d in y.shape[1:]),
        y_dtype=y.dtype.name,
        num_classes=source.num_classes,
        vocab_size=source.vocab_size,
    )


class Job:
    """One experiment's model, optimizer, data and compiled steps."""

    def __init__(
        self,
        spec: ExperimentSpec,
        seed: SeedTuple,
        *,
        max_model_parameters: int | None = None,
        max_activation_elements: int | None = None,
        data: dict[str, np.ndarray] | None = None,
        placement: Placement | None = None,
        model_definition: bytes | None = None,
    ) -> None:
        self.spec, self.seed = spec, seed
        self.placement = placement or Placement(1, [], "default")
        host = Host(self.placement.hosts, self.placement.rank)
        job_data = build_job_data(
            spec,
            seed,
            data=data,
            definition=_definition_info(spec, model_definition),
            own_shards=own_shards(spec.dataset.shards, host),
        )
        source = job_data.source
        self.data: StatelessRngDataset = job_data.train
        self.eval_data: StatelessRngDataset | None = job_data.eval
        self.warnings: list[str] = job_data.warnings
        if host.hosts > 1 and self.data.stateful_random_ops:
            raise GeneratorError(
                self.data.name,
                f"it uses stateful RNG ops ({', '.join(self.data.stateful_random_ops)}), "
                "so no host can generate its rows of a batch alone; it cannot train on "
                "several hosts",
            )
        info = _data_info(self.data, source)

        self.max_activation_elements = max_activation_elements
        self._build(info, max_model_parameters, model_definition)
        self._compile_steps()
        # A batch of exactly (x, y) is digested as a step consumes it: one step per call
        # sees it in Python, a loop of several returns the batches it took. A host of
        # several sees only its rows: the whole batches are digested after training.
        self.digests_batches = host.hosts == 1 and is_xy_pair(self.data.output_spec)
        # Held-out batches are digested as evaluated when they come in batch-id order, as
        # their fingerprint reads them.
        evaluated = self.eval_data
        self.digests_eval = (
            evaluated is not None
            and not evaluated.stateful_random_ops
            and (evaluated.deterministic_order or not evaluated.num_parallel_calls)
            and is_xy_pair(evaluated.output_spec)
        )
        # Several steps per compiled call (`training.steps_per_execution`), in a loop.
        self.looped_steps = LoopedSteps(
            self.train_step, self.data.name, keep_batches=self.digests_batches
        )

    def _build(
        self, info: DataInfo, max_model_parameters: int | None, model_definition: bytes | None
    ) -> None:
        """The model (its size checked), optimizer, loss, metrics and training state."""
        spec = self.spec
        arch = registry.get_component(
            "architecture", spec.model.architecture, loc="model.architecture"
        )
        arch_params = arch.validate_params(spec.model.params, loc="model.params")
        build, unchecked = _model_builder(
            arch,
            arch_params,
            info,
            definition=model_definition if spec.model.definition is not None else None,
            limit=max_model_parameters,
            activation_limit=(self.max_activation_elements, spec.dataset.batch_size),
        )
        keras.backend.clear_session()  # fresh layer-name counters: stable variable paths
        determinism.reseed(self.seed, "init")
        strategy = self.placement.strategy
        tr = spec.training
        # Under a strategy the model's and optimizer's variables are mirrored on every replica.
        with strategy.scope() if strategy is not None else contextlib.nullcontext():
            self.model = build(arch_params, info)
            if not isinstance(self.model, keras.Model):
                raise ArchitectureError(
                    f"architecture {spec.model.architecture!r} did not return a keras.Model"
                )
            if unchecked is not None and max_model_parameters is not None:
                # Fallback: the architecture could not be built without allocating its weights.
                how = f"counted after building it, since {unchecked}"
                check_parameter_limit(self.model.count_params(), max_model_parameters, how=how)
                self.warnings.append(f"the model size limit was checked only after building: {how}")
            self.optimizer = keras.optimizers.get(
                {
                    "class_name": registry.OPTIMIZERS[tr.optimizer.name],
                    "config": tr.optimizer.params,
                }
            )
            self.optimizer.build(self.model.trainable_variables)
        self.make_loss = loss_maker(tr.loss.name, tr.loss.params)
        self.loss_fn = self.make_loss(None)
        self.state = training_state(self.model, self.optimizer)
        self.train_metrics = self._metrics("")
        self.eval_metrics = self._metrics("eval_")

    def _compile_steps(self) -> None:
        """The compiled training and evaluation steps, mirrored across replicas if any."""
        if self.placement.strategy is None:
            self.train_step = tf.function(self._train_step, reduce_retracing=True)
            self.eval_step = tf.function(self._eval_step, reduce_retracing=True)
            return
        steps = MirroredSteps(
            placement=self.placement,
            model=self.model,
            optimizer=self.optimizer,
            make_loss=self.make_loss,
            batch_size=self.spec.dataset.batch_size,
            update_train_metrics=lambda loss, y, out: self._update(
                self.train_metrics, loss, y, out
            ),
            eval_step=self._eval_step,
            outputs_read=len(self.train_metrics) > 1,
        )
        self.train_step = tf.function(steps.train_step, reduce_retracing=True)
        self.eval_step = tf.function(steps.eval_step, reduce_retracing=True)

    def steps_per_call(self) -> tuple[int, str | None]:
        """The spec's steps per compiled call, or 1 and why where steps need Python between
        them (callbacks after every step, data fingerprinted batch by batch)."""
        n = self.spec.training.steps_per_execution
        if n > 1 and getattr(self.model, "training_callbacks", None):
            return 1, "the model's training callbacks run after every step"
        if n > 1 and self.data.stateful_random_ops:
            return 1, "the data is fingerprinted batch by batch as it is consumed"
        return n, None

    def first_training_call(self) -> Callable[[], Any]:
        """One call of the compiled training function the epochs will use, on batch 0: the
        single step, or the loop of several steps run once (its own compile then serves
        the epochs, where the single step would be compiled for nothing)."""
        if self.steps_per_call()[0] > 1:
            first = self.data.as_dataset().take(1)  # the epochs' element spec: no retrace
            return lambda: self.looped_steps(iter(first), 1)
        x, y = _xy(self.data.make_batch(0), self.data.name)
        return lambda: self.train_step(x, y)

    def trace_count(self) -> int:
        """How many times the compiled training and evaluation functions were traced: each
        trace is a compile the job waited for (the single step traced inside the loop of
        several steps counts too)."""
        functions = (self.train_step, self.looped_steps.function, self.eval_step)
        return sum(int(f.experimental_get_tracing_count()) for f in functions)

    def stateful_random_ops(self) -> list[str]:
        """Stateful RNG ops in the compiled training and evaluation functions the job runs.

        Read from their own traces (the pre-flight has made them already; else this makes
        the ones training then calls), not from a throwaway trace, which cost a second
        trace of the model before the first step.
        """
        graphs = []
        if self.steps_per_call()[0] > 1:
            first = iter(self.data.as_dataset().take(1))
            k = tf.constant(1, tf.int32)
            graphs.append(self.looped_steps.function.get_concrete_function(first, k).graph)
        else:
            x, y = _xy(self.data.make_batch(0), self.data.name)
            graphs.append(self.train_step.get_concrete_function(x, y).graph)
        if self.eval_data is not None:
            x, y = _xy(self.eval_data.make_batch(0), self.eval_data.name)
            graphs.append(self.eval_step.get_concrete_function(x, y).graph)
        found: set[str] = set()
        for graph in graphs:
            found.update(stateful_random_ops_in(graph.as_graph_def()))
        return sorted(found)

    def _metrics(self, prefix: str) -> list[keras.metrics.Metric]:
        metrics = [keras.metrics.Mean(name=f"{prefix}loss")]
        for name in self.spec.training.metrics:
            metrics.append(getattr(keras.metrics, registry.METRICS[name])(name=prefix + name))
        return metrics

    def _loss(self, x: tf.Tensor, y: tf.Tensor, training: bool) -> tuple[tf.Tensor, tf.Tensor]:
        out = self.model(x, training=training)
        loss = self.loss_fn(y, out)
        if training and self.model.losses:
            loss += tf.add_n(self.model.losses)
        return loss, out

    def _train_step(self, x: tf.Tensor, y: tf.Tensor) -> tf.Tensor:
        with tf.GradientTape() as tape:
            loss, out = self._loss(x, y, training=True)
        grads = tape.gradient(loss, self.model.trainable_variables)
        self.optimizer.apply_gradients(zip(grads, self.model.trainable_variables, strict=True))
        self._update(self.train_metrics, loss, y, out)
        return loss

    def _eval_step(self, x: tf.Tensor, y: tf.Tensor) -> None:
        loss, out = self._loss(x, y, training=False)
        self._update(self.eval_metrics, loss, y, out)

    @staticmethod
    def _update(
        metrics: list[keras.metrics.Metric], loss: tf.Tensor, y: tf.Tensor, out: tf.Tensor
    ) -> None:
        metrics[0].update_state(loss)
        for metric in metrics[1:]:
            metric.update_state(y, out)

    def point(self, kind: PointKind, epoch: int, step: int) -> TracePoint:
        """A trace point of the current state."""
        fp = fingerprint_state(self.state)
        return TracePoint(
            kind=kind, epoch=epoch, step=step, fingerprint=fp.fingerprint, variables=fp.variables
        )


def _definition_info(spec: ExperimentSpec, definition: bytes | None) -> DefinitionInfo | None:
    """What the model definition the spec trains is (its input dtype decides whether integer
    data stays token ids); None when it trains none."""
    if spec.model.definition is None or definition is None:
        return None
    try:
        return read_definition(definition)
    except DefinitionRefused as exc:
        raise ArchitectureError(f"model definition refused: {exc}") from None


def _model_builder(
    arch: registry.Component,
    params: dict[str, Any],
    info: DataInfo,
    *,
    definition: bytes | None,
    limit: int | None,
    activation_limit: tuple[int | None, int] = (None, 1),
) -> tuple[Callable[..., Any], str | None]:
    """The architecture's factory (given the stored model definition, when the spec names
    one), its size checked against `limit` before any weight exists where possible; and the
    reason when that check must wait for the build. A definition's largest tensor for a
    batch is held against `activation_limit` (limit, batch size) with the data's shape."""
    build = arch.load()
    if definition is not None:
        # A stored definition: counted from its config, before any weight exists.
        checked = read_definition(definition)
        if limit is not None:
            check_parameter_limit(checked.parameter_count, limit, how="counted from its config")
        most, batch = activation_limit
        if most is not None:
            try:
                check_activations(
                    checked, batch_size=batch, limit=most, sample_shape=tuple(info.x_shape)
                )
            except DefinitionRefused as exc:
                raise ArchitectureError(f"model definition refused: {exc}") from None
        return functools.partial(build, definition=definition), None
    if limit is None:
        return build, None
    return build, _check_size_unbuilt(arch, params, info, limit)


def _check_size_unbuilt(
    arch: registry.Component, params: dict[str, Any], info: DataInfo, limit: int
) -> str | None:
    """Check the model size without allocating weights; the reason if that was impossible.

    An architecture that ships a `count_parameters` is asked; any other is built in a Keras
    StatelessScope, where variables get their shapes but no memory until initialised (they
    never are: the scope's variables are dropped with the session before the real build).
    """
    counter = arch.sizer("count_parameters")
    if counter is not None:
        check_parameter_limit(int(counter(params, info)), limit, how="computed before building it")
        return None
    try:
        with keras.StatelessScope(initialize_variables=False):
            model = arch.load()(params, info)
            parameters = int(model.count_params()) if isinstance(model, keras.Model) else None
    except ArchitectureError:
        raise
    except Exception as exc:  # e.g. a layer that creates a variable from a concrete value
        return f"building it without allocating failed ({type(exc).__name__}: {exc})"
    finally:
        keras.backend.clear_session()
    if parameters is None:
        return "the architecture did not return a keras.Model"
    check_parameter_limit(parameters, limit, how="counted from a build that allocated no weights")
    return None
