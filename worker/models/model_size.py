"""Sample shapes of the built-in generators and parameter counts of the built-in architectures.

TensorFlow-free arithmetic, so the API can refuse an oversized model at submission and a
worker before it allocates a single weight. Every count equals Keras's `count_params()`
of the model the architecture builds (trainable and non-trainable weights alike); the
integration tests hold the two together over many parameter combinations.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from worker.data.batch_source import DataInfo
from worker.errors import ArchitectureError
from worker.models import builtin_params as bp
from worker.models import component_params as cp


def check_parameter_limit(parameters: int, limit: int, *, how: str) -> None:
    """ArchitectureError naming the count and the limit when the model is larger than that."""
    if parameters > limit:
        raise ArchitectureError(
            f"the model has {parameters} parameters; this server allows at most {limit} ({how})"
        )


# --- generators: what one sample looks like, from the params alone -------------------------


def gaussian_blobs_info(params: dict[str, Any]) -> DataInfo:
    """x: [num_features] float32, y: class id."""
    p = bp.GaussianBlobsParams.model_validate(params)
    return DataInfo((p.num_features,), "float32", (), "int32", p.num_classes, None)


def regression_info(params: dict[str, Any]) -> DataInfo:
    """x: [num_features] float32, y: [targets] float32."""
    p = bp.RegressionParams.model_validate(params)
    return DataInfo((p.num_features,), "float32", (p.targets,), "float32", None, None)


def pattern_images_info(params: dict[str, Any]) -> DataInfo:
    """x: [image_size, image_size, channels] float32, y: class id."""
    p = bp.PatternImagesParams.model_validate(params)
    shape = (p.image_size, p.image_size, p.channels)
    return DataInfo(shape, "float32", (), "int32", p.num_classes, None)


def token_sequences_info(params: dict[str, Any]) -> DataInfo:
    """x: [seq_len] int32 token ids, y: class id."""
    p = bp.TokenSequencesParams.model_validate(params)
    return DataInfo((p.seq_len,), "int32", (), "int32", p.num_classes, p.vocab_size)


# --- architectures: weights of the model each one builds ------------------------------------


def _dense(inputs: int, units: int, *, bias: bool = True) -> int:
    return inputs * units + (units if bias else 0)


def _batch_norm(features: int) -> int:
    return 4 * features  # gamma, beta, moving mean, moving variance


def mlp_parameters(params: dict[str, Any], data: DataInfo) -> int:
    """Weights of `worker.models.architectures.mlp`."""
    p = bp.MLPParams.model_validate(params)
    width = math.prod(data.x_shape)
    total = 0
    for units in p.hidden:
        total += _dense(width, units) + (_batch_norm(units) if p.batch_norm else 0)
        width = units
    return total + _dense(width, data.output_dim)


def small_cnn_parameters(params: dict[str, Any], data: DataInfo) -> int:
    """Weights of `worker.models.architectures.small_cnn`."""
    p = bp.SmallCNNParams.model_validate(params)
    if len(data.x_shape) != 3:
        raise ArchitectureError(f"small_cnn needs images [H, W, C], got samples {data.x_shape}")
    channels, total = data.x_shape[2], 0
    for filters in p.filters:
        total += p.kernel_size**2 * channels * filters + _batch_norm(filters)  # conv: no bias
        channels = filters
    if p.dense:
        total += _dense(channels, p.dense)
        channels = p.dense
    return total + _dense(channels, data.output_dim)


def _tokens(name: str, data: DataInfo) -> int:
    if data.vocab_size is None or len(data.x_shape) != 1:
        raise ArchitectureError(
            f"{name} needs token sequences [T] with a vocabulary (e.g. the token_sequences "
            f"generator), got samples {data.x_shape} of {data.x_dtype}"
        )
    return data.vocab_size


def tiny_transformer_parameters(params: dict[str, Any], data: DataInfo) -> int:
    """Weights of `worker.models.architectures.tiny_transformer`."""
    p = bp.TinyTransformerParams.model_validate(params)
    vocab = _tokens("tiny_transformer", data)
    if p.embed_dim % p.num_heads:
        raise ArchitectureError("tiny_transformer: embed_dim must be divisible by num_heads")
    e, heads = p.embed_dim, p.num_heads
    projected = heads * (e // heads)
    # query, key and value project E -> heads x key_dim (with bias); output projects back.
    attention = 3 * _dense(e, projected) + _dense(projected, e)
    norms = 2 * 2 * e  # two LayerNormalizations (gamma, beta)
    block = attention + norms + _dense(e, p.ff_dim) + _dense(p.ff_dim, e)
    embeddings = vocab * e + data.x_shape[0] * e
    return embeddings + p.num_blocks * block + _dense(e, data.output_dim)


def gru_parameters(params: dict[str, Any], data: DataInfo) -> int:
    """Weights of `worker.models.architectures.gru` (Keras GRU, default reset_after=True)."""
    p = bp.GRUParams.model_validate(params)
    vocab = _tokens("gru", data)
    units = p.units
    recurrent = 3 * units * (p.embed_dim + units) + 2 * 3 * units
    return vocab * p.embed_dim + recurrent + _dense(units, data.output_dim)


# --- checkpoint layouts: every variable a job's checkpoint holds, in order ------------------


@dataclass(frozen=True)
class VariableLayout:
    """One variable of a saved training state: its path, dtype and shape.

    `trainable` says whether the optimizer keeps slots for it; it is not part of what a
    checkpoint records, so comparisons use `key`.
    """

    path: str
    dtype: str
    shape: tuple[int, ...]
    trainable: bool = True

    @property
    def key(self) -> tuple[str, str, tuple[int, ...]]:
        """(path, dtype, shape): what a checkpoint's manifest and npz headers say."""
        return self.path, self.dtype, self.shape


class _Variables:
    """Model variables in Keras's creation order, as the architecture builds them."""

    def __init__(self) -> None:
        self.found: list[VariableLayout] = []
        self._seeds = 0  # Keras names seed generators by a counter clear_session resets

    def add(self, path: str, *shape: int, trainable: bool = True, dtype: str = "float32") -> None:
        self.found.append(VariableLayout(path, dtype, tuple(shape), trainable))

    def dense(self, name: str, inputs: int, units: int, *, bias: bool = True) -> None:
        self.add(f"{name}/kernel", inputs, units)
        if bias:
            self.add(f"{name}/bias", units)

    def batch_norm(self, name: str, features: int) -> None:
        self.add(f"{name}/gamma", features)
        self.add(f"{name}/beta", features)
        self.add(f"{name}/moving_mean", features, trainable=False)
        self.add(f"{name}/moving_variance", features, trainable=False)

    def seed_generator(self, prefix: str = "") -> None:
        # Dropout (rate > 0), attention dropout and recurrent cells each hold one.
        name = "seed_generator" if self._seeds == 0 else f"seed_generator_{self._seeds}"
        self._seeds += 1
        self.add(f"{prefix}{name}/seed_generator_state", 2, trainable=False, dtype="int64")


def mlp_variables(params: dict[str, Any], data: DataInfo) -> list[VariableLayout]:
    """Variables of `worker.models.architectures.mlp`, paths relative to the model."""
    p, v = bp.MLPParams.model_validate(params), _Variables()
    width = math.prod(data.x_shape)
    for i, units in enumerate(p.hidden):
        v.dense(f"dense_{i}", width, units)
        if p.batch_norm:
            v.batch_norm(f"batch_norm_{i}", units)
        if p.dropout:
            v.seed_generator()
        width = units
    v.dense("output", width, data.output_dim)
    return v.found


def small_cnn_variables(params: dict[str, Any], data: DataInfo) -> list[VariableLayout]:
    """Variables of `worker.models.architectures.small_cnn`, paths relative to the model."""
    p, v = bp.SmallCNNParams.model_validate(params), _Variables()
    if len(data.x_shape) != 3:
        raise ArchitectureError(f"small_cnn needs images [H, W, C], got samples {data.x_shape}")
    channels = data.x_shape[2]
    for i, filters in enumerate(p.filters):
        v.add(f"conv_{i}/kernel", p.kernel_size, p.kernel_size, channels, filters)
        v.batch_norm(f"batch_norm_{i}", filters)
        channels = filters
    if p.dropout:
        v.seed_generator()
    if p.dense:
        v.dense("dense", channels, p.dense)
        channels = p.dense
    v.dense("output", channels, data.output_dim)
    return v.found


def tiny_transformer_variables(params: dict[str, Any], data: DataInfo) -> list[VariableLayout]:
    """Variables of `worker.models.architectures.tiny_transformer`, paths relative to the model."""
    p, v = bp.TinyTransformerParams.model_validate(params), _Variables()
    vocab = _tokens("tiny_transformer", data)
    if p.embed_dim % p.num_heads:
        raise ArchitectureError("tiny_transformer: embed_dim must be divisible by num_heads")
    e, heads, key_dim = p.embed_dim, p.num_heads, p.embed_dim // p.num_heads
    v.add("token_embedding/embeddings", vocab, e)
    v.add("position_embedding/positions", data.x_shape[0], e)
    for i in range(p.num_blocks):
        attention = f"attention_{i}"
        for part in ("query", "key", "value"):
            v.add(f"{attention}/{part}/kernel", e, heads, key_dim)
            v.add(f"{attention}/{part}/bias", heads, key_dim)
        if p.dropout:  # created when the attention layer is built, before its output
            v.seed_generator(f"{attention}/")
        v.add(f"{attention}/attention_output/kernel", heads, key_dim, e)
        v.add(f"{attention}/attention_output/bias", e)
        v.add(f"norm_attn_{i}/gamma", e)
        v.add(f"norm_attn_{i}/beta", e)
        v.dense(f"ff_in_{i}", e, p.ff_dim)
        v.dense(f"ff_out_{i}", p.ff_dim, e)
        if p.dropout:
            v.seed_generator()
        v.add(f"norm_ff_{i}/gamma", e)
        v.add(f"norm_ff_{i}/beta", e)
    v.dense("output", e, data.output_dim)
    return v.found


def gru_variables(params: dict[str, Any], data: DataInfo) -> list[VariableLayout]:
    """Variables of `worker.models.architectures.gru`, paths relative to the model."""
    p, v = bp.GRUParams.model_validate(params), _Variables()
    vocab, units = _tokens("gru", data), p.units
    v.add("token_embedding/embeddings", vocab, p.embed_dim)
    v.add("gru/gru_cell/kernel", p.embed_dim, 3 * units)
    v.add("gru/gru_cell/recurrent_kernel", units, 3 * units)
    v.add("gru/gru_cell/bias", 2, 3 * units)  # reset_after: input and recurrent biases
    v.seed_generator()  # the cell's, for its (unused) dropout masks
    if p.dropout:
        v.seed_generator()
    v.dense("output", units, data.output_dim)
    return v.found


# The name Keras gives an optimizer without one: its class name in snake case.
_OPTIMIZER_NAMES = {
    "Adam": "adam",
    "AdamW": "adam_w",
    "Nadam": "nadam",
    "Adamax": "adamax",
    "SGD": "sgd",
    "RMSprop": "rm_sprop",
    "Adagrad": "adagrad",
    "Lion": "lion",
}


def _slot_kinds(class_name: str, p: Any) -> list[list[str]]:
    """The optimizer's slot passes: each pass adds, per trainable variable, one slot a name."""
    if class_name in ("Adam", "AdamW"):
        return [["momentum", "velocity"]] + ([["velocity_hat"]] if p.amsgrad else [])
    if class_name == "Adamax":
        return [["momentum", "norm"]]
    if class_name == "Nadam":
        return [["momentum", "velocity"]]
    if class_name == "SGD":
        return [["momentum"]] if p.momentum != 0 else []
    if class_name == "RMSprop":
        passes = [["velocity"]]
        return (
            passes
            + ([["momentum"]] if p.momentum > 0 else [])
            + ([["average_gradient"]] if p.centered else [])
        )
    if class_name == "Adagrad":
        return [["accumulator"]]
    if class_name == "Lion":
        return [["momentum"]]
    raise ArchitectureError(f"no variable layout known for optimizer {class_name!r}")


def optimizer_variables(
    class_name: str, params: dict[str, Any], model: list[VariableLayout]
) -> list[VariableLayout]:
    """Variables of a built-in Keras optimizer built on `model`'s trainable variables.

    Paths are relative to the optimizer (`<name>/iteration`, ...), in Keras's creation
    order: iteration, learning rate, EMA averages, gradient accumulators, then the slots.
    """
    p = cp.OPTIMIZER_PARAMS[class_name].model_validate(params)
    name = p.name or _OPTIMIZER_NAMES[class_name]
    found = [
        VariableLayout(f"{name}/iteration", "int64", (), False),
        VariableLayout(f"{name}/learning_rate", "float32", (), False),
    ]
    trainable = [m for m in model if m.trainable]
    passes = [["average"]] if p.use_ema else []
    passes += [["gradient_accumulator"]] if p.gradient_accumulation_steps else []
    for kinds in passes + _slot_kinds(class_name, p):
        for m in trainable:
            stem = f"{name}/{m.path.replace('/', '_')}"
            found += [VariableLayout(f"{stem}_{k}", m.dtype, m.shape, False) for k in kinds]
    if class_name == "Nadam":  # its running product of momentum factors, created unnamed
        dtype = trainable[0].dtype if trainable else "float32"
        found.append(VariableLayout("variable", dtype, (), False))
    return found


# Built-in architectures whose checkpoint layout is known from their params and data.
MODEL_VARIABLES = {
    "mlp": mlp_variables,
    "small_cnn": small_cnn_variables,
    "tiny_transformer": tiny_transformer_variables,
    "gru": gru_variables,
}


def training_state_layout(
    architecture: str,
    params: dict[str, Any],
    data: DataInfo,
    *,
    optimizer: str,
    optimizer_params: dict[str, Any],
) -> list[VariableLayout]:
    """Every variable of a built-in job's checkpoint, as `training_state` paths them."""
    model = MODEL_VARIABLES[architecture](params, data)
    state = [VariableLayout(f"model/{m.path}", m.dtype, m.shape, m.trainable) for m in model]
    opt = optimizer_variables(optimizer, optimizer_params, model)
    return state + [VariableLayout(f"optimizer/{o.path}", o.dtype, o.shape, False) for o in opt]
