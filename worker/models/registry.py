"""Registries of generators, architectures and losses: built-ins plus Python entry points.

Third parties add components through the entry-point groups `reprotrain.generators`,
`reprotrain.architectures` and `reprotrain.losses` of a package installed in the worker image
or of a code bundle. Names are listed without importing anything heavy, so the API can
validate specs cheaply.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import importlib
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any, Literal

from pydantic import BaseModel, ValidationError

from worker.data.batch_source import DataInfo
from worker.errors import SpecError, UnknownComponentError
from worker.models import builtin_params as bp
from worker.models import component_params as cp
from worker.models import keras_definition as kd
from worker.models import model_size as ms
from worker.spec import ExperimentSpec, format_validation_error

Kind = Literal["generator", "architecture", "loss"]
ENTRY_POINT_GROUPS: dict[Kind, str] = {
    "generator": "reprotrain.generators",
    "architecture": "reprotrain.architectures",
    # A factory `my_loss(params: dict) -> keras.losses.Loss` (worker.training.losses).
    "loss": "reprotrain.losses",
}


# Whether this process may import installed plugins' modules to check params and sizes.
# The API may not: a plugin's module usually imports TensorFlow, which the API never loads
# (seconds of start-up inside a request, and its memory in every API process).
_PLUGINS_IMPORTED = [True]


def import_no_plugins() -> None:
    """From now on, installed plugins are known by name only in this process, like a code
    bundle's components: their params and sizes are checked by the job."""
    _PLUGINS_IMPORTED[0] = False


@dataclass(frozen=True)
class Component:
    """A named factory, loaded only when a job needs it."""

    kind: Kind
    name: str
    target: str  # "module:attribute"
    source: str  # "builtin" or the distribution that provides it
    params_model: type[BaseModel] | None = None
    # Sizes from params alone, without TensorFlow: a generator's sample shapes, an
    # architecture's parameter count. A plugin factory may carry them as attributes
    # `data_info(params)` and `count_parameters(params, data_info)`.
    data_info: Callable[[dict[str, Any]], DataInfo] | None = None
    count_parameters: Callable[[dict[str, Any], DataInfo], int] | None = None
    _entry_point: metadata.EntryPoint | None = field(default=None, compare=False, repr=False)
    # Declared by a code bundle the API knows only from its metadata: never imported here, its
    # params are checked by the job that installs it.
    bundled: bool = False
    # An architecture whose model looks up integer token ids (an embedding): generators keep
    # integer data as integers for it. A plugin factory may say so as `takes_token_ids = True`.
    token_ids: bool = False

    @property
    def described_only(self) -> bool:
        """Known by name and source only: a code bundle's, or an installed plugin in a
        process that imports no plugin code (`import_no_plugins`); its job checks the rest."""
        return self.bundled or (self._entry_point is not None and not _PLUGINS_IMPORTED[0])

    def takes_token_ids(self) -> bool:
        """Whether this architecture's model takes integer token ids as its input."""
        if self.token_ids or self.described_only or self._entry_point is None:
            return self.token_ids
        return getattr(self.load(), "takes_token_ids", False) is True

    def load(self) -> Callable[..., Any]:
        """The factory callable."""
        if self.bundled:
            raise RuntimeError(f"{self.kind} {self.name!r} is in a code bundle: not loaded here")
        if self._entry_point is not None:
            obj: Callable[..., Any] = self._entry_point.load()
            return obj
        module, _, attr = self.target.partition(":")
        factory: Callable[..., Any] = getattr(importlib.import_module(module), attr)
        return factory

    def sizer(self, attribute: Literal["data_info", "count_parameters"]) -> Any:
        """The built-in or plugin-provided size function, or None when there is none."""
        found = getattr(self, attribute)
        if self.described_only:
            return None
        if found is None and self._entry_point is not None:
            found = getattr(self.load(), attribute, None)
        return found if callable(found) else None

    def validate_params(self, params: dict[str, Any], *, loc: str) -> dict[str, Any]:
        """Params with defaults filled in; raises SpecError naming the bad field."""
        model = self.params_model
        if self.described_only:
            return dict(params)
        if model is None:
            loaded = self.load()
            model = getattr(loaded, "params_model", None)
        if model is None:
            return dict(params)
        try:
            return model.model_validate(params).model_dump()
        except ValidationError as exc:
            errors = [
                {"loc": f"{loc}.{e['loc']}" if e["loc"] != "$" else loc, "msg": e["msg"]}
                for e in format_validation_error(exc)
            ]
            detail = "; ".join(f"{e['loc']}: {e['msg']}" for e in errors)
            raise SpecError(
                f"invalid {self.kind} params for {self.name!r}: {detail}", errors=errors
            ) from None


_BUILTINS: tuple[Component, ...] = (
    Component(
        "generator",
        "gaussian_blobs",
        "worker.data.generators:gaussian_blobs",
        "builtin",
        bp.GaussianBlobsParams,
        data_info=ms.gaussian_blobs_info,
    ),
    Component(
        "generator",
        "regression",
        "worker.data.generators:regression",
        "builtin",
        bp.RegressionParams,
        data_info=ms.regression_info,
    ),
    Component(
        "generator",
        "pattern_images",
        "worker.data.generators:pattern_images",
        "builtin",
        bp.PatternImagesParams,
        data_info=ms.pattern_images_info,
    ),
    Component(
        "generator",
        "token_sequences",
        "worker.data.generators:token_sequences",
        "builtin",
        bp.TokenSequencesParams,
        data_info=ms.token_sequences_info,
    ),
    Component(
        "generator",
        "arrays",
        "worker.data.arrays:arrays",
        "builtin",
        bp.ArraysParams,
    ),
    Component(
        "architecture",
        "mlp",
        "worker.models.architectures:mlp",
        "builtin",
        bp.MLPParams,
        count_parameters=ms.mlp_parameters,
    ),
    Component(
        "architecture",
        "small_cnn",
        "worker.models.architectures:small_cnn",
        "builtin",
        bp.SmallCNNParams,
        count_parameters=ms.small_cnn_parameters,
    ),
    Component(
        "architecture",
        "tiny_transformer",
        "worker.models.architectures:tiny_transformer",
        "builtin",
        bp.TinyTransformerParams,
        count_parameters=ms.tiny_transformer_parameters,
        token_ids=True,
    ),
    Component(
        "architecture",
        "gru",
        "worker.models.architectures:gru",
        "builtin",
        bp.GRUParams,
        count_parameters=ms.gru_parameters,
        token_ids=True,
    ),
    # A Keras model definition stored by digest (`model.definition`); its size is counted
    # from the definition itself (worker.models.keras_definition), not from params.
    Component(
        "architecture",
        kd.ARCHITECTURE,
        "worker.models.keras_model:from_definition",
        "builtin",
        kd.KerasDefinitionParams,
    ),
)

# Keras class names, so the API can check names without importing Keras.
OPTIMIZERS = {
    "adam": "Adam",
    "adamw": "AdamW",
    "sgd": "SGD",
    "rmsprop": "RMSprop",
    "adagrad": "Adagrad",
    "adamax": "Adamax",
    "nadam": "Nadam",
    "lion": "Lion",
}
LOSSES = {
    "sparse_categorical_crossentropy": "SparseCategoricalCrossentropy",
    "categorical_crossentropy": "CategoricalCrossentropy",
    "binary_crossentropy": "BinaryCrossentropy",
    "mean_squared_error": "MeanSquaredError",
    "mse": "MeanSquaredError",
    "mean_absolute_error": "MeanAbsoluteError",
    "mae": "MeanAbsoluteError",
    "huber": "Huber",
}
METRICS = {
    "accuracy": "SparseCategoricalAccuracy",
    "sparse_categorical_accuracy": "SparseCategoricalAccuracy",
    "mean_squared_error": "MeanSquaredError",
    "mse": "MeanSquaredError",
    "mean_absolute_error": "MeanAbsoluteError",
    "mae": "MeanAbsoluteError",
}


@functools.cache
def components(kind: Kind) -> dict[str, Component]:
    """Every registered component of one kind by name; built-ins win over plugins."""
    found = {c.name: c for c in _BUILTINS if c.kind == kind}
    for ep in metadata.entry_points(group=ENTRY_POINT_GROUPS[kind]):
        if ep.name in found:
            continue  # a plugin may not shadow a built-in: specs would change meaning
        source = ep.dist.name if ep.dist is not None else "unknown"
        found[ep.name] = Component(kind, ep.name, ep.value, source, _entry_point=ep)
    return dict(sorted(found.items()))


_BUNDLED: contextvars.ContextVar[tuple[Component, ...]] = contextvars.ContextVar(
    "bundled_components", default=()
)


@contextlib.contextmanager
def bundled_components(entry_points: Sequence[Mapping[str, str]], source: str) -> Iterator[None]:
    """Within the block, names a code bundle declares (`[{"group","name","value"}]`) count as
    known, without importing anything; a bundle never shadows a built-in."""
    groups = {group: kind for kind, group in ENTRY_POINT_GROUPS.items()}
    found = tuple(
        Component(groups[ep["group"]], ep["name"], ep["value"], source, bundled=True)
        for ep in entry_points
        if ep.get("group") in groups
    )
    token = _BUNDLED.set(found)
    try:
        yield
    finally:
        _BUNDLED.reset(token)


def get_component(kind: Kind, name: str, *, loc: str = "") -> Component:
    """The component registered under `name`, or UnknownComponentError listing the known."""
    bundled = {c.name: c for c in _BUNDLED.get() if c.kind == kind}
    known = {**bundled, **components(kind)}
    if name not in known:
        raise UnknownComponentError(kind, name, list(known), loc=loc)
    return known[name]


def loss_component(name: str) -> Component | None:
    """None for a built-in loss (`LOSSES`); else the installed plugin's or code bundle's loss
    of that name, or UnknownComponentError at `training.loss.name` listing every known loss."""
    if name in LOSSES:
        return None  # a plugin or bundle may not shadow a built-in loss
    loc = "training.loss.name"
    try:
        return get_component("loss", name, loc=loc)
    except UnknownComponentError as exc:
        raise UnknownComponentError("loss", name, [*LOSSES, *exc.known], loc=loc) from None


def check_spec(spec: ExperimentSpec) -> None:
    """Raise SpecError if the spec names an unknown component, gives it bad params, or asks
    a worker for more than it gives (`check_resources`)."""
    gen = get_component("generator", spec.dataset.generator, loc="dataset.generator")
    gen.validate_params(spec.dataset.params, loc="dataset.params")
    _check_stored_data(spec)
    arch = get_component("architecture", spec.model.architecture, loc="model.architecture")
    arch.validate_params(spec.model.params, loc="model.params")
    kd.check_spec_fields(spec.model.architecture, spec.model.definition)
    opt, loss = spec.training.optimizer, spec.training.loss
    if opt.name not in OPTIMIZERS:
        raise UnknownComponentError(
            "optimizer", opt.name, list(OPTIMIZERS), loc="training.optimizer.name"
        )
    cp.validate(
        cp.OPTIMIZER_PARAMS[OPTIMIZERS[opt.name]],
        opt.params,
        loc="training.optimizer.params",
        what=f"optimizer {opt.name!r}",
    )
    custom_loss = loss_component(loss.name)
    if custom_loss is not None:
        custom_loss.validate_params(loss.params, loc="training.loss.params")
    else:
        cp.validate(
            cp.LOSS_PARAMS[LOSSES[loss.name]],
            loss.params,
            loc="training.loss.params",
            what=f"loss {loss.name!r}",
        )
    for i, metric in enumerate(spec.training.metrics):
        if metric not in METRICS:
            raise UnknownComponentError(
                "metric", metric, list(METRICS), loc=f"training.metrics.{i}"
            )
    check_resources(spec)


def _check_stored_data(spec: ExperimentSpec) -> None:
    """The `arrays` generator needs a dataset, and runs without XLA."""
    ds = spec.dataset
    if ds.generator != "arrays":
        return
    if ds.data is None:
        msg = "the arrays generator trains on a stored dataset: give its digest (sha256:...)"
        raise SpecError(f"dataset.data: {msg}", errors=[{"loc": "dataset.data", "msg": msg}])
    if ds.xla:
        # index_shuffle (RandomIndexShuffle) has no XLA kernel in TensorFlow.
        msg = "the arrays generator's stateless shuffle cannot be compiled with XLA"
        raise SpecError(f"dataset.xla: {msg}", errors=[{"loc": "dataset.xla", "msg": msg}])


# Hard bounds a worker applies whatever server sent the spec (an operator may set lower ones).
MAX_BATCH_ELEMENTS = 2**28  # input values in one batch: 1 GiB of float32
MAX_PIPELINE_ELEMENTS = 2**30  # input values buffered by the input pipeline: 4 GiB of float32
MAX_TRACE_POINTS = 100_000  # fingerprints kept per run, each with its per-variable digests


def check_resources(spec: ExperimentSpec) -> None:
    """Raise SpecError if the spec asks a worker for more memory than any worker gives."""
    errors = []
    elements = batch_elements(spec)
    if elements is not None and elements > MAX_BATCH_ELEMENTS:
        errors.append(
            {
                "loc": "dataset.batch_size",
                "msg": f"a batch holds {elements} input values (batch_size x sample size); "
                f"the limit is {MAX_BATCH_ELEMENTS}",
            }
        )
    ds = spec.dataset
    # Batches the input pipeline may hold at once: the one in use, those in flight in
    # parallel calls, and the prefetch buffer ("autotune" sizes itself within a RAM budget).
    held = 1 + sum(n for n in (ds.num_parallel_calls, ds.prefetch) if isinstance(n, int))
    if elements is not None and elements * held > MAX_PIPELINE_ELEMENTS:
        errors.append(
            {
                "loc": "dataset.prefetch",
                "msg": f"the input pipeline may hold {held} batches of {elements} input values "
                f"(1 + num_parallel_calls + prefetch); the limit is {MAX_PIPELINE_ELEMENTS} values",
            }
        )
    tr, steps = spec.training, spec.training.epochs * spec.dataset.train_batches
    points = tr.epochs + (steps // tr.fingerprint_every_steps if tr.fingerprint_every_steps else 0)
    if points > MAX_TRACE_POINTS:
        errors.append(
            {
                "loc": "training.fingerprint_every_steps",
                "msg": f"{points} trace points (epochs + total steps / fingerprint_every_steps); "
                f"the limit is {MAX_TRACE_POINTS}",
            }
        )
    if errors:
        detail = "; ".join(f"{e['loc']}: {e['msg']}" for e in errors)
        raise SpecError(f"spec exceeds a worker's limits: {detail}", errors=errors)


def sample_info(spec: ExperimentSpec) -> DataInfo | None:
    """Shapes of one sample of the spec's data, from params alone; None if not computable."""
    gen = get_component("generator", spec.dataset.generator, loc="dataset.generator")
    describe = gen.sizer("data_info")
    if describe is None:
        return None
    info: DataInfo = describe(gen.validate_params(spec.dataset.params, loc="dataset.params"))
    return info


def batch_elements(spec: ExperimentSpec) -> int | None:
    """Input values in one batch (batch size x sample size), or None if not computable."""
    info = sample_info(spec)
    if info is None:
        return None
    return spec.dataset.batch_size * math.prod(info.x_shape)


def parameter_count(spec: ExperimentSpec) -> int | None:
    """Parameters of the spec's model, computed without building it; None if not computable.

    Raises ArchitectureError when the architecture cannot take this data at all.
    """
    arch = get_component("architecture", spec.model.architecture, loc="model.architecture")
    count = arch.sizer("count_parameters")
    info = sample_info(spec) if count is not None else None
    if count is None or info is None:
        return None
    return int(count(arch.validate_params(spec.model.params, loc="model.params"), info))
