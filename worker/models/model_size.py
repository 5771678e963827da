"""Sample shapes of the built-in generators and parameter counts of the built-in architectures.

TensorFlow-free arithmetic, so the API can refuse an oversized model at submission and a
worker before it allocates a single weight. Every count equals Keras's `count_params()`
of the model the architecture builds (trainable and non-trainable weights alike); the
integration tests hold the two together over many parameter combinations.
"""

from __future__ import annotations

import math
from typing import Any

from worker.data.batch_source import DataInfo
from worker.errors import ArchitectureError
from worker.models import builtin_params as bp


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
