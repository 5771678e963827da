"""The checkpoint layout of a job that trains a Keras model definition, without TensorFlow.

A job loads a definition with Keras's deserializer, which builds every layer from the input
shape its config records (`build_config`: `input_shape` first, else `shapes_dict`, as
Keras's `build_from_config` reads it), outside any name scope: so a variable's path is its
layer's name and its own (`dense/kernel`), whichever model nests the layer, and only
sublayers a layer creates while it is built (an RNN's cell, a wrapper's copies built late,
attention projections) sit under their builder's name. Seed generators are named from one
counter in the order their layers are deserialized (the config's order), which a job resets
before it loads the model. From that and each layer's config, this module lists every model
variable with its dtype and shape, and the optimizer state `model_size` derives from them:
what the server checks a definition run's final checkpoint against.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from worker.models import model_size as ms
from worker.models.keras_definition import DefinitionInfo
from worker.record.variable_reads import unique_paths

Shape = list[int | None]
MODELS = frozenset({"Functional", "Sequential"})  # models whose layers are walked in turn
# Layers holding a seed generator once their rate (or stddev) is above zero.
_RANDOM = {
    "Dropout": "rate",
    "SpatialDropout1D": "rate",
    "SpatialDropout2D": "rate",
    "SpatialDropout3D": "rate",
    "GaussianDropout": "rate",
    "AlphaDropout": "rate",
    "GaussianNoise": "stddev",
}
_CELLS = {"SimpleRNN": "simple_rnn_cell", "GRU": "gru_cell", "LSTM": "lstm_cell"}


class LayoutUnknown(ValueError):
    """The definition holds something whose variables this module cannot derive."""


def _variable_dtype(cfg: dict[str, Any]) -> str:
    """The dtype a layer's variables get: its policy's variable dtype (float32 for the
    mixed policies and for none)."""
    dtype = cfg.get("dtype")
    if isinstance(dtype, dict):
        dtype = (dtype.get("config") or {}).get("name")
    if dtype is None:
        return "float32"
    name = str(dtype)
    return "float32" if name.startswith("mixed_") else name


def _ints(value: Any) -> list[int]:
    return [int(v) for v in value] if isinstance(value, list | tuple) else [int(value)]


def _dim(shape: Shape, axis: int, where: str) -> int:
    try:
        value = shape[axis]
    except IndexError:
        value = None
    if not isinstance(value, int) or value < 1:
        raise LayoutUnknown(f"{where}: its weights depend on input axis {axis}, unknown in {shape}")
    return value


def build_shapes(layer: dict[str, Any]) -> dict[str, Any] | None:
    """The shapes Keras's `build_from_config` builds the layer with: `{"input_shape": s}`
    when the build config records `input_shape` (the first argument of `build`), else its
    `shapes_dict`; None when it records neither (the layer is built later, when called)."""
    build = layer.get("build_config")
    if not isinstance(build, dict) or not build:
        return None
    if "input_shape" in build:
        return {"input_shape": build["input_shape"]}
    shapes = build.get("shapes_dict")
    return dict(shapes) if isinstance(shapes, dict) else None


def _single(shapes: dict[str, Any], where: str) -> Shape:
    """The one shape a one-input layer's `build` takes, however it was recorded."""
    if len(shapes) != 1:
        raise LayoutUnknown(f"{where}: the build config records {sorted(shapes)}, not one shape")
    shape = next(iter(shapes.values()))
    if not isinstance(shape, list) or not all(isinstance(d, int) or d is None for d in shape):
        raise LayoutUnknown(f"{where}: the build config's shape {shape!r} is not a shape")
    return shape


class _Walk:
    """Model variables in Keras's order of creation, as a job's deserializer makes them."""

    def __init__(self) -> None:
        self.found: list[ms.VariableLayout] = []
        self.seeds = 0  # Keras's counter naming seed generators, reset by the job

    def add(self, path: str, shape: tuple[int, ...], dtype: str, trainable: bool) -> None:
        self.found.append(ms.VariableLayout(path, dtype, shape, trainable))

    def seed(self) -> str:
        """The next seed generator's name (its state is added by whoever holds it)."""
        name = "seed_generator" if self.seeds == 0 else f"seed_generator_{self.seeds}"
        self.seeds += 1
        return name

    def seed_state(self, prefix: str, name: str) -> None:
        self.add(f"{prefix}{name}/seed_generator_state", (2,), "int64", False)

    def model(self, config: dict[str, Any], trainable: bool) -> None:
        inner = config.get("config") or {}
        for layer in inner.get("layers") or []:
            self.layer(layer, trainable and inner.get("trainable", True) is not False)

    def layer(self, layer: dict[str, Any], trainable: bool) -> None:
        class_name = str(layer.get("class_name"))
        if class_name in MODELS:
            self.model(layer, trainable)
            return
        cfg = layer.get("config") or {}
        trainable = trainable and cfg.get("trainable", True) is not False
        name = str(cfg.get("name"))
        if class_name in _RANDOM:
            if float(cfg.get(_RANDOM[class_name]) or 0) > 0:
                self.seed_state("", self.seed())
            return
        shapes = build_shapes(layer)
        if class_name in _CELLS:
            self.rnn(class_name, cfg, shapes, "", trainable)
        elif class_name == "Bidirectional":
            self.bidirectional(cfg, shapes, trainable)
        elif class_name == "MultiHeadAttention":
            self.attention(cfg, shapes, trainable)
        elif class_name in _WEIGHTS:
            if shapes is None:
                raise LayoutUnknown(f"{name}: no build config records its input shape")
            for var, shape, natural in _WEIGHTS[class_name](cfg, _single(shapes, name), name):
                self.add(f"{name}/{var}", shape, _variable_dtype(cfg), trainable and natural)

    def rnn(
        self,
        class_name: str,
        cfg: dict[str, Any],
        shapes: dict[str, Any] | None,
        prefix: str,
        trainable: bool,
    ) -> None:
        """An RNN layer: its cell's seed generator is named as the layer is deserialized;
        its weights come from its build config, else from `shapes` under `prefix`."""
        seed = self.seed()
        name = str(cfg.get("name"))
        if shapes is None:
            raise LayoutUnknown(f"{name}: no build config records its input shape")
        width, units = _dim(_single(shapes, name), -1, name), int(cfg["units"])
        gates = {"SimpleRNN": 1, "GRU": 3, "LSTM": 4}[class_name]
        cell, dtype = f"{prefix}{name}/{_CELLS[class_name]}", _variable_dtype(cfg)
        self.add(f"{cell}/kernel", (width, gates * units), dtype, trainable)
        self.add(f"{cell}/recurrent_kernel", (units, gates * units), dtype, trainable)
        if cfg.get("use_bias", True):
            two = class_name == "GRU" and cfg.get("reset_after", True)
            bias = (2, gates * units) if two else (gates * units,)
            self.add(f"{cell}/bias", bias, dtype, trainable)
        self.seed_state("", seed)  # the cell's, made in its __init__, outside any scope

    def bidirectional(
        self, cfg: dict[str, Any], shapes: dict[str, Any] | None, trainable: bool
    ) -> None:
        """The wrapped layer is deserialized, then the given backward layer, then a copy of
        the wrapped one renamed `forward_...`; the wrapper's variables are the copy's and the
        backward layer's. A copy without a build config of its own is built by the wrapper's
        build, under the wrapper's name."""
        name = str(cfg.get("name"))
        inner, backward = cfg.get("layer"), cfg.get("backward_layer")
        if not isinstance(inner, dict) or inner.get("class_name") not in _CELLS:
            raise LayoutUnknown(f"{name}: Bidirectional wraps a GRU, LSTM or SimpleRNN")
        if backward is not None and (
            not isinstance(backward, dict) or backward.get("class_name") not in _CELLS
        ):
            raise LayoutUnknown(f"{name}: its backward layer is not a GRU, LSTM or SimpleRNN")
        wrapped = _Walk()  # the wrapped layer itself holds nothing of the model's
        wrapped.seeds = self.seeds
        inner_cfg = inner.get("config") or {}
        wrapped.rnn(str(inner["class_name"]), inner_cfg, build_shapes(inner) or shapes, "", True)
        self.seeds = wrapped.seeds
        trainable = trainable and cfg.get("trainable", True) is not False
        given: _Walk | None = None
        if backward is not None:
            given = self._rnn_copy(backward, dict(backward.get("config") or {}), shapes, name)
            given.found = [
                ms.VariableLayout(v.path, v.dtype, v.shape, trainable and v.trainable)
                for v in given.found
            ]
        forward_cfg = dict(inner_cfg, name="forward_" + _strip(inner_cfg.get("name"), "forward_"))
        forward = self._rnn_copy(inner, forward_cfg, shapes, name)
        if given is None:
            back_cfg = dict(
                inner_cfg, name="backward_" + _strip(inner_cfg.get("name"), "backward_")
            )
            given = self._rnn_copy(inner, back_cfg, shapes, name)
        for v in forward.found + given.found:
            self.add(v.path, v.shape, v.dtype, trainable and v.trainable)

    def _rnn_copy(
        self, layer: dict[str, Any], cfg: dict[str, Any], shapes: dict[str, Any] | None, owner: str
    ) -> _Walk:
        """One RNN a Bidirectional holds, with the seed it takes from the shared counter."""
        copy = _Walk()
        copy.seeds = self.seeds
        own = build_shapes(layer)
        prefix = "" if own is not None else f"{owner}/"
        copy.rnn(str(layer["class_name"]), cfg, own or shapes, prefix, True)
        self.seeds = copy.seeds
        return copy

    def attention(
        self, cfg: dict[str, Any], shapes: dict[str, Any] | None, trainable: bool
    ) -> None:
        """MultiHeadAttention: query, key, value and output projections, made in its build
        (under its name), with its dropout's seed generator between value and output."""
        name = str(cfg.get("name"))
        if shapes is None or "query_shape" not in shapes or "value_shape" not in shapes:
            raise LayoutUnknown(f"{name}: its build config records no query and value shapes")
        if cfg.get("use_gate"):
            raise LayoutUnknown(f"{name}: gated attention")
        query, value = shapes["query_shape"], shapes["value_shape"]
        key = shapes.get("key_shape") or value
        heads, key_dim = int(cfg["num_heads"]), int(cfg["key_dim"])
        value_dim = int(cfg.get("value_dim") or key_dim)
        out = cfg.get("output_shape")
        out_shape = tuple(_ints(out)) if out else (_dim(query, -1, name),)
        bias, dtype = cfg.get("use_bias", True), _variable_dtype(cfg)
        parts = [("query", query, key_dim), ("key", key, key_dim), ("value", value, value_dim)]
        for part, shape, dim in parts:
            self.add(f"{name}/{part}/kernel", (_dim(shape, -1, name), heads, dim), dtype, trainable)
            if bias:
                self.add(f"{name}/{part}/bias", (heads, dim), dtype, trainable)
        if float(cfg.get("dropout") or 0) > 0:  # its Dropout, made in its build
            self.seed_state(f"{name}/", self.seed())
        self.add(
            f"{name}/attention_output/kernel", (heads, value_dim, *out_shape), dtype, trainable
        )
        if bias:
            self.add(f"{name}/attention_output/bias", out_shape, dtype, trainable)


def _strip(name: Any, prefix: str) -> str:
    text = str(name)
    return text[len(prefix) :] if text.startswith(prefix) else text


Weights = list[tuple[str, tuple[int, ...], bool]]  # (name, shape, trainable)


def _channels(cfg: dict[str, Any], shape: Shape, where: str) -> int:
    return _dim(shape, 1 if cfg.get("data_format") == "channels_first" else -1, where)


def _bias(cfg: dict[str, Any], size: int) -> Weights:
    return [("bias", (size,), True)] if cfg.get("use_bias", True) else []


def _dense(cfg: dict[str, Any], shape: Shape, where: str) -> Weights:
    units = int(cfg["units"])
    return [("kernel", (_dim(shape, -1, where), units), True), *_bias(cfg, units)]


def _conv(cfg: dict[str, Any], shape: Shape, where: str) -> Weights:
    filters, groups = int(cfg["filters"]), int(cfg.get("groups") or 1)
    kernel = (*_ints(cfg["kernel_size"]), _channels(cfg, shape, where) // groups, filters)
    return [("kernel", kernel, True), *_bias(cfg, filters)]


def _conv_transpose(cfg: dict[str, Any], shape: Shape, where: str) -> Weights:
    filters = int(cfg["filters"])
    kernel = (*_ints(cfg["kernel_size"]), filters, _channels(cfg, shape, where))
    return [("kernel", kernel, True), *_bias(cfg, filters)]


def _depthwise(cfg: dict[str, Any], shape: Shape, where: str) -> Weights:
    channels, multiplier = _channels(cfg, shape, where), int(cfg.get("depth_multiplier") or 1)
    kernel = (*_ints(cfg["kernel_size"]), channels, multiplier)
    return [("kernel", kernel, True), *_bias(cfg, channels * multiplier)]


def _separable(cfg: dict[str, Any], shape: Shape, where: str) -> Weights:
    channels, multiplier = _channels(cfg, shape, where), int(cfg.get("depth_multiplier") or 1)
    sizes, filters = _ints(cfg["kernel_size"]), int(cfg["filters"])
    return [
        ("depthwise_kernel", (*sizes, channels, multiplier), True),
        ("pointwise_kernel", (*(1 for _ in sizes), channels * multiplier, filters), True),
        *_bias(cfg, filters),
    ]


def _normalized(cfg: dict[str, Any], shape: Shape, where: str) -> tuple[int, ...]:
    axes = _ints(cfg.get("axis", -1))
    if len(axes) > 1:  # LayerNormalization sorts a list of axes
        axes = sorted(axes)
    return tuple(_dim(shape, a, where) for a in axes)


def _batch_norm(cfg: dict[str, Any], shape: Shape, where: str) -> Weights:
    size: tuple[int, ...] = (_dim(shape, int(cfg.get("axis", -1)), where),)
    found = [("gamma", size, True)] if cfg.get("scale", True) else []
    found += [("beta", size, True)] if cfg.get("center", True) else []
    found += [("moving_mean", size, False), ("moving_variance", size, False)]
    if cfg.get("renorm"):
        found += [("moving_stddev", size, False), ("renorm_mean", size, False)]
        found += [("renorm_stddev", size, False)]
    return found


def _layer_norm(cfg: dict[str, Any], shape: Shape, where: str) -> Weights:
    size, rms = _normalized(cfg, shape, where), bool(cfg.get("rms_scaling"))
    found = [("gamma", size, True)] if cfg.get("scale", True) or rms else []
    return found + ([("beta", size, True)] if cfg.get("center", True) and not rms else [])


def _group_norm(cfg: dict[str, Any], shape: Shape, where: str) -> Weights:
    size: tuple[int, ...] = (_dim(shape, int(cfg.get("axis", -1)), where),)
    found = [("gamma", size, True)] if cfg.get("scale", True) else []
    return found + ([("beta", size, True)] if cfg.get("center", True) else [])


def _embedding(cfg: dict[str, Any], shape: Shape, where: str) -> Weights:
    return [("embeddings", (int(cfg["input_dim"]), int(cfg["output_dim"])), True)]


_WEIGHTS: dict[str, Callable[[dict[str, Any], Shape, str], Weights]] = {
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
}


def definition_variables(info: DefinitionInfo) -> list[ms.VariableLayout]:
    """Every variable of the model a job loads from the definition, paths relative to the
    model, in Keras's creation order for a config listing its layers in graph order (as
    `to_json()` writes it); LayoutUnknown when a layer's variables cannot be derived."""
    walk = _Walk()
    try:
        walk.model(info.config, True)
    except (KeyError, TypeError, ValueError) as exc:
        if isinstance(exc, LayoutUnknown):
            raise
        raise LayoutUnknown(
            f"a layer's config cannot be read ({type(exc).__name__}: {exc})"
        ) from None
    return walk.found


def definition_state_layout(
    info: DefinitionInfo, *, optimizer: str, optimizer_params: dict[str, Any]
) -> list[ms.VariableLayout]:
    """Every variable of a definition job's checkpoint, as `training_state` paths them
    (`model/...`, then `optimizer/...`, a repeated path suffixed `#1`, `#2`, ...)."""
    model = definition_variables(info)
    state = [ms.VariableLayout(f"model/{m.path}", m.dtype, m.shape, m.trainable) for m in model]
    opt = ms.optimizer_variables(optimizer, optimizer_params, model)
    state += [ms.VariableLayout(f"optimizer/{o.path}", o.dtype, o.shape, False) for o in opt]
    paths = unique_paths([v.path for v in state])
    return [
        ms.VariableLayout(p, v.dtype, v.shape, v.trainable)
        for p, v in zip(paths, state, strict=True)
    ]
