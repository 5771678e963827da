"""Keras model definitions checked without TensorFlow: the allow-list, the walk, the size.

A definition is a Keras JSON config (`model.to_json()`) or a `.keras` archive, of which only
`config.json` is read: the archive's weights are ignored, and every run starts from the
seeded initialisation its spec determines. Every object in the config (layers, nested
models, initializers, regularizers, constraints, dtype policies) must be one of Keras's own
serializable classes (definition_allow_list), from the module Keras writes it under, under
its own registered name: a `Lambda` layer, a custom object or anything from another module
is refused, as is anything Keras's safe mode would refuse, so loading an accepted definition
runs no code but Keras's. The model's tensors are followed from its input through every
layer (definition_graph): each layer's parameters are counted from the shapes it is called
on, a recorded `build_config` that says otherwise is refused, and the largest activation is
known, so the API can refuse an oversized model at push and a worker before it allocates a
weight. This module is the one entry point; the API and the worker both use it.
"""

from __future__ import annotations

import hashlib
import io
import json
import zipfile
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict

from worker.data.batch_source import DataInfo
from worker.errors import SpecError
from worker.models.definition_allow_list import MODELS, DefinitionRefused, check_object
from worker.models.definition_graph import (
    LayerInfo,
    Propagation,
    config_sha256,
    input_layer_shape,
    shape_of,
)
from worker.models.definition_shapes import Shape

ARCHITECTURE = "keras"  # `model.architecture` of a spec that names a definition
ARCHIVE_CONFIG = "config.json"
MAX_ARCHIVE_MEMBERS = 64  # a `.keras` archive holds config.json, metadata.json and weights

MAX_LIST_LENGTH = 1_024  # entries of any list in a config but a model's layers
__all__ = ["MODELS", "DefinitionRefused", "LayerInfo", "config_sha256"]  # re-exported


@dataclass(frozen=True)
class DefinitionLimits:
    """Bounds on what is read: bytes of the config, JSON nesting and layers."""

    max_bytes: int = 4 * 1024**2
    max_depth: int = 64
    max_layers: int = 2_000


@dataclass(frozen=True)
class DefinitionInfo:
    """What a checked definition is: its format, config, layers, size and input."""

    format: str  # "keras_json" or "keras_archive"
    config: dict[str, Any]
    layers: list[LayerInfo] = field(default_factory=list)
    parameter_count: int = 0
    input_shape: tuple[int | None, ...] = ()  # one sample's shape, without the batch axis
    input_dtype: str = "float32"
    output_units: int | None = None  # units of the output layer when it is a Dense layer
    # Values per example of the model's largest tensor (input, output or in between) whose
    # size the definition fixes, and the layer making it; sizes that depend on an input
    # axis left open (None) are known only with the data (`largest_activation`).
    largest_activation: int = 0
    largest_activation_at: str = ""

    def layer_records(self) -> list[dict[str, Any]]:
        """The layers, JSON-ready."""
        return [layer.as_record() for layer in self.layers]


def read_definition(data: bytes, *, limits: DefinitionLimits | None = None) -> DefinitionInfo:
    """Check a definition (JSON config or `.keras` archive); DefinitionRefused otherwise."""
    limits = limits or DefinitionLimits()
    fmt, text = _config_bytes(data, limits)
    config = _parse(text, limits)
    _check_objects(config, "", limits, [0])
    shape, dtype = _model_input(config)
    walk = Propagation(max_calls=2 * limits.max_layers)
    layers = walk.model(config, "", None, check=True)[1]
    return DefinitionInfo(
        format=fmt,
        config=config,
        layers=layers,
        parameter_count=sum(layer.parameters for layer in layers),
        input_shape=shape,
        input_dtype=dtype,
        output_units=_output_units(config),
        largest_activation=walk.largest,
        largest_activation_at=walk.largest_at,
    )


def largest_activation(
    info: DefinitionInfo, sample_shape: tuple[int, ...] | None = None
) -> tuple[int, str]:
    """(values per example, layer path) of the model's largest tensor when fed samples of
    `sample_shape` (the data's), or of the largest the definition fixes without it."""
    if sample_shape is None or None not in info.input_shape:
        return info.largest_activation, info.largest_activation_at
    walk = Propagation(max_calls=2 * max(len(info.layers), 1))
    walk.model(info.config, "", [(None, *sample_shape)], check=False)
    return walk.largest, walk.largest_at


def check_activations(
    info: DefinitionInfo,
    *,
    batch_size: int,
    limit: int,
    sample_shape: tuple[int, ...] | None = None,
) -> None:
    """DefinitionRefused naming the layer when the model's largest tensor for a batch of
    `batch_size` holds more than `limit` values (REPRO_MAX_ACTIVATION_ELEMENTS)."""
    per_example, where = largest_activation(info, sample_shape)
    if per_example * batch_size > limit:
        raise DefinitionRefused(
            f"its largest activation holds {per_example} values per example, "
            f"{per_example * batch_size} for a batch of {batch_size}; this server allows at "
            f"most {limit} (REPRO_MAX_ACTIVATION_ELEMENTS)",
            path=where or "model",
        )


def _check_objects(
    config: dict[str, Any], parent: str, limits: DefinitionLimits, seen: list[int]
) -> None:
    """Every object of a (nested) model on the allow-list, and at most `max_layers` layers.
    Its compile settings are dropped unread: the spec's optimizer, loss and metrics are the
    ones trained with."""
    config.pop("compile_config", None)
    check_object(config, parent or "model")
    inner = config.get("config")
    name = inner.get("name") if isinstance(inner, dict) else None
    path = f"{parent}/{name}" if parent else str(name or "model")
    layers = inner.get("layers") if isinstance(inner, dict) else None
    if not isinstance(layers, list):
        raise DefinitionRefused("a model config lists its layers", path=path)
    for index, layer in enumerate(layers):
        if not isinstance(layer, dict):
            raise DefinitionRefused(f"layer {index} is not an object", path=path)
        if layer.get("class_name") in MODELS:
            _check_objects(layer, path, limits, seen)
            continue
        seen[0] += 1
        if seen[0] > limits.max_layers:
            raise DefinitionRefused(
                f"more than {limits.max_layers} layers (REPRO_MAX_MODEL_DEFINITION_LAYERS)",
                path=path,
            )
        cfg = layer.get("config")
        layer_name = cfg.get("name") if isinstance(cfg, dict) else None
        check_object(layer, f"{path}/{layer_name if layer_name else index}")


def _model_input(config: dict[str, Any]) -> tuple[tuple[int | None, ...], str]:
    """One sample's shape and dtype: the model's single InputLayer (or Sequential's
    recorded build input shape)."""
    inner = config.get("config") or {}
    inputs = [
        layer for layer in inner.get("layers", [])
        if isinstance(layer, dict) and layer.get("class_name") == "InputLayer"
    ]  # fmt: skip
    if config.get("class_name") == "Functional" and len(inputs) != 1:
        raise DefinitionRefused(
            f"the model has {len(inputs)} inputs; a job feeds exactly one (x)", path="model"
        )
    shape: Shape
    if inputs:
        shape = input_layer_shape(inputs[0], "model")
        dtype = str((inputs[0].get("config") or {}).get("dtype") or "float32")
    else:
        found = inner.get("build_input_shape")
        if not found:
            raise DefinitionRefused(
                "the model records no input shape: build it from keras.Input(...)", path="model"
            )
        shape, dtype = shape_of(found, "build_input_shape", "model"), "float32"
    if not shape:
        raise DefinitionRefused("the model's input has no batch axis", path="model")
    return shape[1:], dtype


def digest_of(data: bytes) -> str:
    """`sha256:<hex>` of the definition's bytes, as stored and named in specs."""
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _config_bytes(data: bytes, limits: DefinitionLimits) -> tuple[str, bytes]:
    if not data.startswith(b"PK"):
        if len(data) > limits.max_bytes:
            raise DefinitionRefused(
                f"the definition is {len(data)} bytes; the limit is {limits.max_bytes} "
                "(REPRO_MAX_MODEL_DEFINITION_BYTES)"
            )
        return "keras_json", data
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            members = archive.infolist()
            if len(members) > MAX_ARCHIVE_MEMBERS:
                raise DefinitionRefused(
                    f"the archive has {len(members)} members; a .keras archive has at most "
                    f"{MAX_ARCHIVE_MEMBERS}"
                )
            found = [m for m in members if m.filename == ARCHIVE_CONFIG]
            if len(found) != 1:
                raise DefinitionRefused(
                    f"a .keras archive holds exactly one {ARCHIVE_CONFIG} at its top level"
                )
            member = found[0]
            if member.file_size > limits.max_bytes:
                raise DefinitionRefused(
                    f"{ARCHIVE_CONFIG} declares {member.file_size} bytes; the limit is "
                    f"{limits.max_bytes} (REPRO_MAX_MODEL_DEFINITION_BYTES)"
                )
            with archive.open(member) as fh:
                text = fh.read(limits.max_bytes + 1)  # a lying header cannot make it more
            if len(text) != member.file_size:
                raise DefinitionRefused(f"{ARCHIVE_CONFIG} is not the size its header declares")
    except (zipfile.BadZipFile, zipfile.LargeZipFile, NotImplementedError, EOFError) as exc:
        raise DefinitionRefused(f"not a readable .keras archive ({exc})") from None
    return "keras_archive", text


def _no_constant(name: str) -> Any:
    raise DefinitionRefused(f"{name} is not a JSON number")


def _parse(text: bytes, limits: DefinitionLimits) -> dict[str, Any]:
    try:
        config = json.loads(text, parse_constant=_no_constant)
    except RecursionError:
        raise DefinitionRefused(f"the JSON nests deeper than {limits.max_depth} levels") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise DefinitionRefused(
            f"not a Keras JSON config or .keras archive (invalid JSON: {exc})"
        ) from None
    _check_depth(config, limits.max_depth)
    if not isinstance(config, dict) or config.get("class_name") not in MODELS:
        raise DefinitionRefused(
            "the top level must be a Keras model config (Functional or Sequential), "
            "as model.to_json() writes it"
        )
    return config


def _check_depth(value: Any, limit: int) -> None:
    """Refuse JSON nested deeper than `limit`, or a list longer than MAX_LIST_LENGTH (a
    model's layer list aside, which REPRO_MAX_MODEL_DEFINITION_LAYERS bounds)."""
    stack: list[tuple[Any, int, str]] = [(value, 1, "")]
    while stack:
        item, depth, key = stack.pop()
        if depth > limit:
            raise DefinitionRefused(
                f"the JSON nests deeper than {limit} levels (REPRO_MAX_MODEL_DEFINITION_DEPTH)"
            )
        if isinstance(item, dict):
            stack.extend((v, depth + 1, k) for k, v in item.items())
        elif isinstance(item, list):
            if len(item) > MAX_LIST_LENGTH and key != "layers":
                raise DefinitionRefused(
                    f"a list ({key or 'top level'}) has {len(item)} entries; a list in a "
                    f"model config has at most {MAX_LIST_LENGTH}"
                )
            stack.extend((v, depth + 1, key) for v in item)


class KerasDefinitionParams(BaseModel):
    """`model.params` of the `keras` architecture: none, the definition says everything."""

    model_config = ConfigDict(extra="forbid", strict=True)


def check_spec_fields(architecture: str, definition: str | None) -> None:
    """SpecError naming the field when `keras` has no definition or another architecture
    has one."""
    if architecture == ARCHITECTURE and definition is None:
        msg = "the keras architecture trains a stored model definition: give its digest"
    elif architecture != ARCHITECTURE and definition is not None:
        msg = (
            f"a model definition is trained by architecture {ARCHITECTURE!r}, not {architecture!r}"
        )
    else:
        return
    raise SpecError(f"model.definition: {msg}", errors=[{"loc": "model.definition", "msg": msg}])


def _output_units(config: dict[str, Any]) -> int | None:
    inner = config.get("config") or {}
    layers = [layer for layer in inner.get("layers", []) if isinstance(layer, dict)]
    if not layers:
        return None
    last = layers[-1]
    outputs = inner.get("output_layers")
    if config.get("class_name") == "Functional":
        if isinstance(outputs, list) and outputs and isinstance(outputs[0], list):
            outputs = outputs[0] if len(outputs) == 1 else None
        named = outputs[0] if isinstance(outputs, list) and outputs else None
        found = [la for la in layers if (la.get("config") or {}).get("name") == named]
        last = found[0] if found else {}
    if last.get("class_name") != "Dense":
        return None
    units = (last.get("config") or {}).get("units")
    return units if isinstance(units, int) else None


def _histories(node: Any) -> list[str]:
    """The layer names a layer's inbound nodes read from (`keras_history`), anywhere in them."""
    if isinstance(node, dict):
        history = (node.get("config") or {}).get("keras_history") if "config" in node else None
        found = [history[0]] if isinstance(history, list) and history else []
        return found + [n for v in node.values() for n in _histories(v)]
    if isinstance(node, list):
        return [n for v in node for n in _histories(v)]
    return []


def input_embeddings(config: dict[str, Any]) -> list[tuple[str, int]]:
    """(name, input_dim) of the Embedding layers that read the model's input directly: the
    ids they look up are the data's token ids."""
    inner = config.get("config") or {}
    layers = [la for la in inner.get("layers", []) if isinstance(la, dict)]

    def named(layer: dict[str, Any]) -> tuple[str, int] | None:
        cfg = layer.get("config") or {}
        dim = cfg.get("input_dim")
        if layer.get("class_name") != "Embedding" or not isinstance(dim, int):
            return None
        return str(cfg.get("name") or layer.get("name")), dim

    if config.get("class_name") == "Sequential":
        body = [la for la in layers if la.get("class_name") != "InputLayer"]
        first = named(body[0]) if body else None
        return [first] if first else []
    inputs = {
        str((la.get("config") or {}).get("name") or la.get("name"))
        for la in layers
        if la.get("class_name") == "InputLayer"
    }
    found = []
    for layer in layers:
        embedding = named(layer)
        if embedding and inputs & set(_histories(layer.get("inbound_nodes"))):
            found.append(embedding)
    return found


def takes_token_ids(info: DefinitionInfo) -> bool:
    """Whether the definition's input takes integer token ids: its input layer's dtype is
    not a floating-point one."""
    return not info.input_dtype.startswith(("float", "bfloat"))


def check_fits(info: DefinitionInfo, data: DataInfo) -> None:
    """DefinitionRefused saying why when the data cannot feed the model: one sample's shape,
    integer token ids against a float input, token ids beyond an input Embedding's
    input_dim, or the output width against the classes."""
    want, got = info.input_shape, tuple(data.x_shape)
    if len(want) != len(got) or any(
        w is not None and w != g for w, g in zip(want, got, strict=True)
    ):
        shown = tuple("None" if d is None else d for d in want)
        raise DefinitionRefused(
            f"the model takes samples of shape {shown}; the data gives {got}", path="model"
        )
    data_ints = not data.x_dtype.startswith(("float", "bfloat"))
    if takes_token_ids(info) and not data_ints:
        raise DefinitionRefused(
            f"the model takes {info.input_dtype} (token ids) but the data gives {data.x_dtype}; "
            "store the ids as an integer array (and leave dataset.params.x_dtype unset or int32)",
            path="model",
        )
    if data.vocab_size is not None:
        for name, input_dim in input_embeddings(info.config):
            if input_dim < data.vocab_size:
                raise DefinitionRefused(
                    f"the Embedding {name!r} looks up ids 0..{input_dim - 1} (input_dim "
                    f"{input_dim}); the data's token ids run to {data.vocab_size - 1} "
                    f"(vocabulary {data.vocab_size}): raise input_dim to {data.vocab_size}",
                    path="model",
                )
    if info.output_units is not None and info.output_units != data.output_dim:
        what = "classes" if data.num_classes is not None else "regression targets"
        raise DefinitionRefused(
            f"the model's output layer has {info.output_units} units; the data has "
            f"{data.output_dim} {what}",
            path="model",
        )
