"""Parameters of the allow-listed Keras layers, from a layer's config and its input shapes.

The shapes are the ones propagated through the model from its input (the same ones Keras
builds the layer with, since a definition whose recorded `build_config` disagrees is
refused), so the count is what Keras allocates: its `count_params()`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from worker.models.definition_allow_list import PARAMETER_FREE, DefinitionRefused
from worker.models.definition_shapes import Call, Shape, ShapeError

Counter = Callable[[dict[str, Any], Shape, str], int]


def _dim(shape: Shape, axis: int, path: str) -> int:
    try:
        value = shape[axis]
    except IndexError:
        value = None
    if not isinstance(value, int) or value < 1:
        raise DefinitionRefused(
            f"its weights depend on input axis {axis}, which is unknown in {list(shape)}",
            path=path,
        )
    return value


def _channels(cfg: dict[str, Any], shape: Shape, path: str) -> int:
    axis = 1 if cfg.get("data_format") == "channels_first" else -1
    return _dim(shape, axis, path)


def _ints(value: Any) -> list[int]:
    return [int(v) for v in value] if isinstance(value, list | tuple) else [int(value)]


def _bias(cfg: dict[str, Any]) -> int:
    return 1 if cfg.get("use_bias", True) else 0


def _dense(cfg: dict[str, Any], shape: Shape, path: str) -> int:
    units, width = int(cfg["units"]), _dim(shape, -1, path)
    return width * units + units * _bias(cfg)


def _conv(cfg: dict[str, Any], shape: Shape, path: str) -> int:
    channels, filters = _channels(cfg, shape, path), int(cfg["filters"])
    kernel = math.prod(_ints(cfg["kernel_size"]))
    return kernel * (channels // int(cfg.get("groups") or 1)) * filters + filters * _bias(cfg)


def _conv_transpose(cfg: dict[str, Any], shape: Shape, path: str) -> int:
    channels, filters = _channels(cfg, shape, path), int(cfg["filters"])
    return math.prod(_ints(cfg["kernel_size"])) * channels * filters + filters * _bias(cfg)


def _depthwise(cfg: dict[str, Any], shape: Shape, path: str) -> int:
    out = _channels(cfg, shape, path) * int(cfg.get("depth_multiplier") or 1)
    return math.prod(_ints(cfg["kernel_size"])) * out + out * _bias(cfg)


def _separable(cfg: dict[str, Any], shape: Shape, path: str) -> int:
    middle = _channels(cfg, shape, path) * int(cfg.get("depth_multiplier") or 1)
    filters = int(cfg["filters"])
    depthwise = math.prod(_ints(cfg["kernel_size"])) * middle
    return depthwise + middle * filters + filters * _bias(cfg)


def _normalized(cfg: dict[str, Any], shape: Shape, path: str) -> int:
    return math.prod(_dim(shape, a, path) for a in _ints(cfg.get("axis", -1)))


def _batch_norm(cfg: dict[str, Any], shape: Shape, path: str) -> int:
    weights = 2 + bool(cfg.get("center", True)) + bool(cfg.get("scale", True))
    return _normalized(cfg, shape, path) * weights


def _layer_norm(cfg: dict[str, Any], shape: Shape, path: str) -> int:
    if cfg.get("rms_scaling"):
        return _normalized(cfg, shape, path)
    weights = bool(cfg.get("center", True)) + bool(cfg.get("scale", True))
    return _normalized(cfg, shape, path) * weights


def _group_norm(cfg: dict[str, Any], shape: Shape, path: str) -> int:
    weights = bool(cfg.get("center", True)) + bool(cfg.get("scale", True))
    return _normalized(cfg, shape, path) * weights


def _embedding(cfg: dict[str, Any], shape: Shape, path: str) -> int:
    return int(cfg["input_dim"]) * int(cfg["output_dim"])


def _rnn(gates: int) -> Counter:
    def count(cfg: dict[str, Any], shape: Shape, path: str) -> int:
        units, width = int(cfg["units"]), _dim(shape, -1, path)
        biases = gates * units * _bias(cfg)
        if gates == 3 and cfg.get("reset_after", True):
            biases *= 2  # separate input and recurrent biases
        return gates * units * (width + units) + biases

    return count


_RECURRENT = ("GRU", "LSTM", "SimpleRNN")


def _bidirectional(cfg: dict[str, Any], shape: Shape, path: str) -> int:
    total = 0
    for key in ("layer", "backward_layer"):
        inner = cfg.get(key) if key == "layer" else cfg.get(key) or cfg.get("layer")
        if not isinstance(inner, dict) or inner.get("class_name") not in _RECURRENT:
            raise DefinitionRefused("Bidirectional wraps a GRU, LSTM or SimpleRNN", path=path)
        total += _COUNTERS[str(inner["class_name"])](inner.get("config") or {}, shape, path)
    return total


def _attention(cfg: dict[str, Any], call: Call, path: str) -> int:
    if cfg.get("use_gate"):
        raise DefinitionRefused("gated attention is not counted by this service", path=path)
    query, value = call.shape(0, "query"), call.shape(1, "value")
    key = call.shape(2, "key") if call.argument(2, "key") is not None else value
    heads, key_dim = int(cfg["num_heads"]), int(cfg["key_dim"])
    value_dim = int(cfg.get("value_dim") or key_dim)
    out = cfg.get("output_shape")
    out_dim = math.prod(_ints(out)) if out else _dim(query, -1, path)
    b = _bias(cfg)
    projections = (
        _dim(query, -1, path) * heads * key_dim + heads * key_dim * b
        + _dim(key, -1, path) * heads * key_dim + heads * key_dim * b
        + _dim(value, -1, path) * heads * value_dim + heads * value_dim * b
    )  # fmt: skip
    return projections + heads * value_dim * out_dim + out_dim * b


_COUNTERS: dict[str, Counter] = {
    "Dense": _dense,
    "Conv1D": _conv,
    "Conv2D": _conv,
    "Conv3D": _conv,
    "Conv1DTranspose": _conv_transpose,
    "Conv2DTranspose": _conv_transpose,
    "Conv3DTranspose": _conv_transpose,
    "DepthwiseConv1D": _depthwise,
    "DepthwiseConv2D": _depthwise,
    "SeparableConv1D": _separable,
    "SeparableConv2D": _separable,
    "BatchNormalization": _batch_norm,
    "LayerNormalization": _layer_norm,
    "GroupNormalization": _group_norm,
    "Embedding": _embedding,
    "SimpleRNN": _rnn(1),
    "GRU": _rnn(3),
    "LSTM": _rnn(4),
    "Bidirectional": _bidirectional,
}


def count(layer: dict[str, Any], call: Call, path: str, *, operation: bool) -> int:
    """Parameters Keras builds for `layer` first called with `call`'s input shapes."""
    class_name = str(layer.get("class_name"))
    if class_name in PARAMETER_FREE or operation:
        return 0
    cfg = layer.get("config")
    if not isinstance(cfg, dict):
        raise DefinitionRefused("a layer's config is an object", path=path, class_name=class_name)
    if cfg.get("lora_rank") or cfg.get("quantization_config"):
        raise DefinitionRefused(
            "LoRA and quantized layers are not counted by this service", path=path
        )
    if not layer.get("build_config"):
        raise DefinitionRefused(
            "no input shape recorded (input_shape): push a built model, e.g. one made from "
            "keras.Input(...)",
            path=path,
            class_name=class_name,
        )
    try:
        if class_name == "MultiHeadAttention":
            return _attention(cfg, call, path)
        return _COUNTERS[class_name](cfg, call.shape(0, "sequences" if class_name in (
            *_RECURRENT, "Bidirectional") else None), path)  # fmt: skip
    except (KeyError, TypeError, ValueError) as exc:
        if isinstance(exc, DefinitionRefused):
            raise
        if isinstance(exc, ShapeError):
            raise DefinitionRefused(str(exc), path=path, class_name=class_name) from None
        raise DefinitionRefused(
            f"its config cannot be read ({type(exc).__name__}: {exc})",
            path=path,
            class_name=class_name,
        ) from None
