"""Registries of generators and architectures: built-ins plus Python entry points.

Third parties add components through the entry-point groups `reprotrain.generators`
and `reprotrain.architectures` of a package installed in the worker image. Names are
listed without importing anything heavy, so the API can validate specs cheaply.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any, Literal

from pydantic import BaseModel, ValidationError

from worker import builtin_params as bp
from worker.errors import SpecError, UnknownComponentError
from worker.spec import ExperimentSpec, format_validation_error

Kind = Literal["generator", "architecture"]
ENTRY_POINT_GROUPS: dict[Kind, str] = {
    "generator": "reprotrain.generators",
    "architecture": "reprotrain.architectures",
}


@dataclass(frozen=True)
class Component:
    """A named factory, loaded only when a job needs it."""

    kind: Kind
    name: str
    target: str  # "module:attribute"
    source: str  # "builtin" or the distribution that provides it
    params_model: type[BaseModel] | None = None
    _entry_point: metadata.EntryPoint | None = field(default=None, compare=False, repr=False)

    def load(self) -> Callable[..., Any]:
        """The factory callable."""
        if self._entry_point is not None:
            obj: Callable[..., Any] = self._entry_point.load()
            return obj
        module, _, attr = self.target.partition(":")
        factory: Callable[..., Any] = getattr(importlib.import_module(module), attr)
        return factory

    def validate_params(self, params: dict[str, Any], *, loc: str) -> dict[str, Any]:
        """Params with defaults filled in; raises SpecError naming the bad field."""
        model = self.params_model
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
        "worker.generators:gaussian_blobs",
        "builtin",
        bp.GaussianBlobsParams,
    ),
    Component(
        "generator", "regression", "worker.generators:regression", "builtin", bp.RegressionParams
    ),
    Component(
        "generator",
        "pattern_images",
        "worker.generators:pattern_images",
        "builtin",
        bp.PatternImagesParams,
    ),
    Component(
        "generator",
        "token_sequences",
        "worker.generators:token_sequences",
        "builtin",
        bp.TokenSequencesParams,
    ),
    Component("architecture", "mlp", "worker.architectures:mlp", "builtin", bp.MLPParams),
    Component(
        "architecture", "small_cnn", "worker.architectures:small_cnn", "builtin", bp.SmallCNNParams
    ),
    Component(
        "architecture",
        "tiny_transformer",
        "worker.architectures:tiny_transformer",
        "builtin",
        bp.TinyTransformerParams,
    ),
    Component("architecture", "gru", "worker.architectures:gru", "builtin", bp.GRUParams),
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
        found[ep.name] = Component(kind, ep.name, ep.value, source, None, ep)
    return dict(sorted(found.items()))


def get_component(kind: Kind, name: str, *, loc: str = "") -> Component:
    """The component registered under `name`, or UnknownComponentError listing the known."""
    known = components(kind)
    if name not in known:
        raise UnknownComponentError(kind, name, list(known), loc=loc)
    return known[name]


def check_spec(spec: ExperimentSpec) -> None:
    """Raise SpecError if the spec names an unknown component or gives it bad params."""
    gen = get_component("generator", spec.dataset.generator, loc="dataset.generator")
    gen.validate_params(spec.dataset.params, loc="dataset.params")
    arch = get_component("architecture", spec.model.architecture, loc="model.architecture")
    arch.validate_params(spec.model.params, loc="model.params")
    named = (
        ("optimizer", spec.training.optimizer.name, OPTIMIZERS, "training.optimizer.name"),
        ("loss", spec.training.loss.name, LOSSES, "training.loss.name"),
    )
    for kind, name, table, loc in named:
        if name not in table:
            raise UnknownComponentError(kind, name, list(table), loc=loc)
    for i, metric in enumerate(spec.training.metrics):
        if metric not in METRICS:
            raise UnknownComponentError(
                "metric", metric, list(METRICS), loc=f"training.metrics.{i}"
            )
