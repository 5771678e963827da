"""Keras model definitions checked without TensorFlow: the allow-list, the walk, the size.

A definition is a Keras JSON config (`model.to_json()`) or a `.keras` archive, of which only
`config.json` is read: the archive's weights are ignored, and every run starts from the
seeded initialisation its spec determines. Every object in the config (layers, nested
models, initializers, regularizers, constraints, dtype policies) must be one of Keras's own
serializable classes listed here, from a `keras` module, under its own registered name:
a `Lambda` layer, a custom object or anything from another module is refused, as is
anything Keras's safe mode would refuse, so loading an accepted definition runs no code
but Keras's. The parameter count is arithmetic on each layer's config and the input shape
Keras recorded when the model was built (`build_config`), so the API can refuse an
oversized model at push and a worker before it allocates a weight. This module is the one
place the allow-list lives; the API and the worker both use it.
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import zipfile
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict

from worker.data.batch_source import DataInfo
from worker.errors import SpecError

ARCHITECTURE = "keras"  # `model.architecture` of a spec that names a definition
ARCHIVE_CONFIG = "config.json"
MAX_ARCHIVE_MEMBERS = 64  # a `.keras` archive holds config.json, metadata.json and weights

MODELS = frozenset({"Functional", "Sequential"})
# Layers that hold no weights.
PARAMETER_FREE = frozenset(
    {
        "InputLayer", "Activation", "ReLU", "LeakyReLU", "ELU", "Softmax", "Identity",
        "Add", "Subtract", "Multiply", "Average", "Maximum", "Minimum", "Concatenate", "Dot",
        "Flatten", "Reshape", "Permute", "RepeatVector", "Rescaling",
        "Dropout", "SpatialDropout1D", "SpatialDropout2D", "SpatialDropout3D",
        "GaussianNoise", "GaussianDropout", "AlphaDropout",
        "MaxPooling1D", "MaxPooling2D", "MaxPooling3D",
        "AveragePooling1D", "AveragePooling2D", "AveragePooling3D",
        "GlobalAveragePooling1D", "GlobalAveragePooling2D", "GlobalAveragePooling3D",
        "GlobalMaxPooling1D", "GlobalMaxPooling2D", "GlobalMaxPooling3D",
        "ZeroPadding1D", "ZeroPadding2D", "ZeroPadding3D",
        "Cropping1D", "Cropping2D", "Cropping3D",
        "UpSampling1D", "UpSampling2D", "UpSampling3D", "UnitNormalization",
    }
)  # fmt: skip
# Keras operations recorded as layers when a model applies `+`, `*`, ... to tensors.
OPERATIONS = frozenset({"Add", "Subtract", "Multiply", "TrueDivide", "Negative", "Mean", "Sum"})
INITIALIZERS = frozenset(
    {
        "Constant", "GlorotNormal", "GlorotUniform", "HeNormal", "HeUniform", "Identity",
        "LecunNormal", "LecunUniform", "Ones", "Orthogonal", "RandomNormal", "RandomUniform",
        "TruncatedNormal", "VarianceScaling", "Zeros",
    }
)  # fmt: skip
REGULARIZERS = frozenset({"L1", "L2", "L1L2", "OrthogonalRegularizer"})
CONSTRAINTS = frozenset({"MaxNorm", "MinMaxNorm", "NonNeg", "UnitNorm"})
DTYPE_POLICIES = frozenset({"DTypePolicy", "FloatDTypePolicy"})
# Serialization markers with no module: tensors between layers, tuples.
MARKERS = frozenset({"__keras_tensor__", "__tuple__"})
ACTIVATIONS = frozenset(
    {
        "linear", "relu", "relu6", "leaky_relu", "elu", "selu", "gelu", "silu", "swish",
        "sigmoid", "hard_sigmoid", "hard_silu", "hard_swish", "tanh", "softmax", "log_softmax",
        "softplus", "softsign", "exponential", "mish", "celu", "glu", "tanh_shrink",
        "hard_tanh", "soft_shrink", "hard_shrink", "squareplus", "sparse_plus", "log_sigmoid",
    }
)  # fmt: skip


class DefinitionRefused(ValueError):
    """The definition is not one this service accepts; `path` and `class_name` say where."""

    def __init__(self, message: str, *, path: str = "", class_name: str | None = None) -> None:
        where = f"{path}: " if path else ""
        what = f"{class_name}: " if class_name and class_name not in message else ""
        super().__init__(f"{where}{what}{message}")
        self.path, self.class_name = path, class_name


@dataclass(frozen=True)
class DefinitionLimits:
    """Bounds on what is read: bytes of the config, JSON nesting and layers."""

    max_bytes: int = 4 * 1024**2
    max_depth: int = 64
    max_layers: int = 2_000


@dataclass(frozen=True)
class LayerInfo:
    """One layer as the checker found it."""

    path: str  # model name / nested model names / layer name
    class_name: str
    parameters: int
    config_sha256: str  # of the layer's canonical config, to say which layers differ

    def as_record(self) -> dict[str, Any]:
        """JSON-ready form, as stored and shown."""
        return {
            "path": self.path,
            "class_name": self.class_name,
            "parameters": self.parameters,
            "config_sha256": self.config_sha256,
        }


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

    def layer_records(self) -> list[dict[str, Any]]:
        """The layers, JSON-ready."""
        return [layer.as_record() for layer in self.layers]


def read_definition(data: bytes, *, limits: DefinitionLimits | None = None) -> DefinitionInfo:
    """Check a definition (JSON config or `.keras` archive); DefinitionRefused otherwise."""
    limits = limits or DefinitionLimits()
    fmt, text = _config_bytes(data, limits)
    config = _parse(text, limits)
    walker = _Walker(limits)
    layers = walker.model(config, "")
    shape, dtype = _model_input(config)
    return DefinitionInfo(
        format=fmt,
        config=config,
        layers=layers,
        parameter_count=sum(layer.parameters for layer in layers),
        input_shape=shape,
        input_dtype=dtype,
        output_units=_output_units(config),
    )


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
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if depth > limit:
            raise DefinitionRefused(
                f"the JSON nests deeper than {limit} levels (REPRO_MAX_MODEL_DEFINITION_DEPTH)"
            )
        if isinstance(item, dict):
            stack.extend((v, depth + 1) for v in item.values())
        elif isinstance(item, list):
            stack.extend((v, depth + 1) for v in item)


def config_sha256(config: Any) -> str:
    """SHA-256 of a config's canonical JSON (keys sorted, no spaces)."""
    text = json.dumps(config, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


def _allowed(class_name: str, module: str | None) -> bool:
    if class_name in MARKERS:
        return module is None
    if module is None or not (module == "keras" or module.startswith("keras.")):
        return False
    if module.startswith("keras.src.ops."):
        return class_name in OPERATIONS
    kinds = (
        MODELS | PARAMETER_FREE | frozenset(_COUNTERS) | INITIALIZERS | REGULARIZERS
        | CONSTRAINTS | DTYPE_POLICIES
    )  # fmt: skip
    return class_name in kinds


class _Walker:
    """Walks a model config: checks every object and counts every layer's parameters."""

    def __init__(self, limits: DefinitionLimits) -> None:
        self.limits = limits
        self.layer_total = 0

    def model(self, config: dict[str, Any], parent: str) -> list[LayerInfo]:
        """Every layer of a (nested) model, checked and counted. Its compile settings are
        dropped unread: the spec's optimizer, loss and metrics are the ones trained with."""
        config.pop("compile_config", None)
        self.check_object(config, parent or "model")
        inner = config.get("config")
        name = inner.get("name") if isinstance(inner, dict) else None
        path = f"{parent}/{name}" if parent else str(name or "model")
        layers = inner.get("layers") if isinstance(inner, dict) else None
        if not isinstance(layers, list):
            raise DefinitionRefused("a model config lists its layers", path=path)
        found: list[LayerInfo] = []
        for index, layer in enumerate(layers):
            if not isinstance(layer, dict):
                raise DefinitionRefused(f"layer {index} is not an object", path=path)
            found.extend(self.layer(layer, path, index))
        return found

    def layer(self, layer: dict[str, Any], parent: str, index: int) -> list[LayerInfo]:
        """One layer (a nested model's layers for a model), checked and counted."""
        class_name = str(layer.get("class_name"))
        if class_name in MODELS:
            return self.model(layer, parent)
        self.layer_total += 1
        if self.layer_total > self.limits.max_layers:
            raise DefinitionRefused(
                f"more than {self.limits.max_layers} layers (REPRO_MAX_MODEL_DEFINITION_LAYERS)",
                path=parent,
            )
        config = layer.get("config")
        name = config.get("name") if isinstance(config, dict) else None
        path = f"{parent}/{name if name else index}"
        self.check_object(layer, path)
        parameters = _count(layer, path)
        return [LayerInfo(path, class_name, parameters, config_sha256(config))]

    def check_object(self, obj: dict[str, Any], path: str) -> None:
        """Refuse `obj`, or anything nested in it, that is not on the allow-list (a model's
        own layers excepted: they are walked as layers)."""
        _check_one(obj, path)
        stack: list[tuple[Any, str]] = []
        for key, value in obj.items():
            if key == "config" and obj.get("class_name") in MODELS and isinstance(value, dict):
                stack.extend((v, f"{path}/{k}") for k, v in value.items() if k != "layers")
            else:
                stack.append((value, path if key == "config" else f"{path}/{key}"))
        while stack:
            item, where = stack.pop()
            if isinstance(item, list):
                stack.extend((v, f"{where}/{i}") for i, v in enumerate(item))
                continue
            if not isinstance(item, dict):
                continue
            if "class_name" in item:
                _check_one(item, where)
                if item.get("class_name") in MODELS:
                    raise DefinitionRefused("a model nested outside the layer list", path=where)
            for key, value in item.items():
                if key in ("activation", "recurrent_activation") and isinstance(value, str):
                    _check_activation(value, f"{where}/{key}")
                stack.append((value, where if key == "config" else f"{where}/{key}"))


def _check_one(item: dict[str, Any], where: str) -> None:
    class_name, module = item.get("class_name"), item.get("module")
    registered = item.get("registered_name")
    if not isinstance(class_name, str) or not (module is None or isinstance(module, str)):
        raise DefinitionRefused("class_name and module must be strings", path=where)
    if class_name in ("Lambda", "__lambda__"):
        raise DefinitionRefused(
            "Lambda layers hold Python code and are refused; use Keras layers, or push the "
            "code as a code bundle",
            path=where,
            class_name="Lambda",
        )
    if class_name == "function":
        if module in ("keras.activations", "keras.src.activations.activations"):
            _check_activation(str(item.get("config")), where)
            return
        raise DefinitionRefused(
            f"a function from module {module!r} is not one of Keras's activations",
            path=where,
            class_name=class_name,
        )
    if registered is not None and (not isinstance(registered, str) or registered != class_name):
        raise DefinitionRefused(
            f"registered as {registered!r}: custom objects are refused",
            path=where,
            class_name=class_name,
        )
    if not _allowed(class_name, module):
        raise DefinitionRefused(
            f"{class_name} from module {module!r} is not on this service's allow-list of "
            "Keras classes (custom objects and classes outside keras are refused)",
            path=where,
            class_name=class_name,
        )


def _check_activation(name: str, where: str) -> None:
    if name not in ACTIVATIONS:
        raise DefinitionRefused(f"activation {name!r} is not one of Keras's", path=where)


# --- parameter counts, from a layer's config and its recorded input shape -------------------


def _shape(layer: dict[str, Any], path: str, key: str = "input_shape") -> list[int | None]:
    build = layer.get("build_config") or {}
    shapes = build.get("shapes_dict") if isinstance(build, dict) else None
    shape = (shapes or {}).get(key) if shapes else build.get(key)
    if not isinstance(shape, list) or not all(isinstance(d, int) or d is None for d in shape):
        raise DefinitionRefused(
            f"no input shape recorded ({key}): push a built model, e.g. one made from "
            "keras.Input(...)",
            path=path,
            class_name=str(layer.get("class_name")),
        )
    return shape


def _dim(shape: list[int | None], axis: int, path: str) -> int:
    try:
        value = shape[axis]
    except IndexError:
        value = None
    if not isinstance(value, int) or value < 1:
        raise DefinitionRefused(
            f"its weights depend on input axis {axis}, which is unknown in {shape}", path=path
        )
    return value


def _channels(cfg: dict[str, Any], shape: list[int | None], path: str) -> int:
    axis = 1 if cfg.get("data_format") == "channels_first" else -1
    return _dim(shape, axis, path)


def _ints(value: Any) -> list[int]:
    return [int(v) for v in value] if isinstance(value, list | tuple) else [int(value)]


def _bias(cfg: dict[str, Any]) -> int:
    return 1 if cfg.get("use_bias", True) else 0


def _dense(cfg: dict[str, Any], shape: list[int | None], path: str) -> int:
    units, width = int(cfg["units"]), _dim(shape, -1, path)
    return width * units + units * _bias(cfg)


def _conv(cfg: dict[str, Any], shape: list[int | None], path: str) -> int:
    channels, filters = _channels(cfg, shape, path), int(cfg["filters"])
    kernel = math.prod(_ints(cfg["kernel_size"]))
    return kernel * (channels // int(cfg.get("groups") or 1)) * filters + filters * _bias(cfg)


def _conv_transpose(cfg: dict[str, Any], shape: list[int | None], path: str) -> int:
    channels, filters = _channels(cfg, shape, path), int(cfg["filters"])
    return math.prod(_ints(cfg["kernel_size"])) * channels * filters + filters * _bias(cfg)


def _depthwise(cfg: dict[str, Any], shape: list[int | None], path: str) -> int:
    out = _channels(cfg, shape, path) * int(cfg.get("depth_multiplier") or 1)
    return math.prod(_ints(cfg["kernel_size"])) * out + out * _bias(cfg)


def _separable(cfg: dict[str, Any], shape: list[int | None], path: str) -> int:
    middle = _channels(cfg, shape, path) * int(cfg.get("depth_multiplier") or 1)
    filters = int(cfg["filters"])
    depthwise = math.prod(_ints(cfg["kernel_size"])) * middle
    return depthwise + middle * filters + filters * _bias(cfg)


def _normalized(cfg: dict[str, Any], shape: list[int | None], path: str) -> int:
    return math.prod(_dim(shape, a, path) for a in _ints(cfg.get("axis", -1)))


def _batch_norm(cfg: dict[str, Any], shape: list[int | None], path: str) -> int:
    weights = 2 + bool(cfg.get("center", True)) + bool(cfg.get("scale", True))
    return _normalized(cfg, shape, path) * weights


def _layer_norm(cfg: dict[str, Any], shape: list[int | None], path: str) -> int:
    if cfg.get("rms_scaling"):
        return _normalized(cfg, shape, path)
    weights = bool(cfg.get("center", True)) + bool(cfg.get("scale", True))
    return _normalized(cfg, shape, path) * weights


def _group_norm(cfg: dict[str, Any], shape: list[int | None], path: str) -> int:
    weights = bool(cfg.get("center", True)) + bool(cfg.get("scale", True))
    return _normalized(cfg, shape, path) * weights


def _embedding(cfg: dict[str, Any], shape: list[int | None], path: str) -> int:
    return int(cfg["input_dim"]) * int(cfg["output_dim"])


def _rnn(gates: int) -> Callable[[dict[str, Any], list[int | None], str], int]:
    def count(cfg: dict[str, Any], shape: list[int | None], path: str) -> int:
        units, width = int(cfg["units"]), _dim(shape, -1, path)
        biases = gates * units * _bias(cfg)
        if gates == 3 and cfg.get("reset_after", True):
            biases *= 2  # separate input and recurrent biases
        return gates * units * (width + units) + biases

    return count


_RECURRENT = ("GRU", "LSTM", "SimpleRNN")


def _bidirectional(cfg: dict[str, Any], shape: list[int | None], path: str) -> int:
    total = 0
    for key in ("layer", "backward_layer"):
        inner = cfg.get(key) if key == "layer" else cfg.get(key) or cfg.get("layer")
        if not isinstance(inner, dict) or inner.get("class_name") not in _RECURRENT:
            raise DefinitionRefused("Bidirectional wraps a GRU, LSTM or SimpleRNN", path=path)
        total += _COUNTERS[str(inner["class_name"])](inner.get("config") or {}, shape, path)
    return total


def _attention(cfg: dict[str, Any], layer: dict[str, Any], path: str) -> int:
    if cfg.get("use_gate"):
        raise DefinitionRefused("gated attention is not counted by this service", path=path)
    query = _shape(layer, path, "query_shape")
    value = _shape(layer, path, "value_shape")
    recorded = str(layer.get("build_config"))
    key = _shape(layer, path, "key_shape") if "key_shape" in recorded else value
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


Counter = Callable[[dict[str, Any], list[int | None], str], int]
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
    "MultiHeadAttention": lambda cfg, shape, path: 0,  # counted by _attention
}


def _count(layer: dict[str, Any], path: str) -> int:
    class_name = str(layer.get("class_name"))
    if class_name in PARAMETER_FREE or str(layer.get("module", "")).startswith("keras.src.ops."):
        return 0
    cfg = layer.get("config")
    if not isinstance(cfg, dict):
        raise DefinitionRefused("a layer's config is an object", path=path, class_name=class_name)
    if cfg.get("lora_rank") or cfg.get("quantization_config"):
        raise DefinitionRefused(
            "LoRA and quantized layers are not counted by this service", path=path
        )
    try:
        if class_name == "MultiHeadAttention":
            return _attention(cfg, layer, path)
        return _COUNTERS[class_name](cfg, _shape(layer, path), path)
    except (KeyError, TypeError, ValueError) as exc:
        if isinstance(exc, DefinitionRefused):
            raise
        raise DefinitionRefused(
            f"its config cannot be read ({type(exc).__name__}: {exc})",
            path=path,
            class_name=class_name,
        ) from None


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
    if inputs:
        cfg = inputs[0].get("config") or {}
        shape = cfg.get("batch_shape") or cfg.get("batch_input_shape")
        dtype = str(cfg.get("dtype") or "float32")
    else:
        shape, dtype = inner.get("build_input_shape"), "float32"
    if not isinstance(shape, list) or not shape:
        raise DefinitionRefused(
            "the model records no input shape: build it from keras.Input(...)", path="model"
        )
    return tuple(d if isinstance(d, int) else None for d in shape[1:]), dtype


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


def takes_token_ids(info: DefinitionInfo) -> bool:
    """Whether the definition's input takes integer token ids: its input layer's dtype is
    not a floating-point one."""
    return not info.input_dtype.startswith(("float", "bfloat"))


def check_fits(info: DefinitionInfo, data: DataInfo) -> None:
    """DefinitionRefused saying why when the data cannot feed the model: one sample's shape,
    integer token ids against a float input, or the output width against the classes."""
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
    if info.output_units is not None and info.output_units != data.output_dim:
        what = "classes" if data.num_classes is not None else "regression targets"
        raise DefinitionRefused(
            f"the model's output layer has {info.output_units} units; the data has "
            f"{data.output_dim} {what}",
            path="model",
        )
