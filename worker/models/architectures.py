"""Built-in architectures. Layers get explicit names so variable paths are stable."""

from __future__ import annotations

from typing import Any

import keras

from worker.data.batch_source import DataInfo
from worker.errors import ArchitectureError
from worker.models import builtin_params as bp


def _inputs(data: DataInfo) -> keras.KerasTensor:
    return keras.Input(shape=data.x_shape, dtype=data.x_dtype, name="inputs")


def mlp(params: dict[str, Any], data: DataInfo) -> keras.Model:
    """Dense layers (optional BatchNorm and Dropout) to one logits/regression layer."""
    p = bp.MLPParams.model_validate(params)
    inputs = _inputs(data)
    h = keras.layers.Flatten(name="flatten")(inputs) if len(data.x_shape) > 1 else inputs
    if data.vocab_size is not None or not data.x_dtype.startswith("float"):
        h = keras.layers.Lambda(lambda t: keras.ops.cast(t, "float32"), name="to_float")(h)
    for i, units in enumerate(p.hidden):
        h = keras.layers.Dense(units, activation=p.activation, name=f"dense_{i}")(h)
        if p.batch_norm:
            h = keras.layers.BatchNormalization(name=f"batch_norm_{i}")(h)
        if p.dropout:
            h = keras.layers.Dropout(p.dropout, name=f"dropout_{i}")(h)
    outputs = keras.layers.Dense(data.output_dim, name="output")(h)
    return keras.Model(inputs, outputs, name="mlp")


def small_cnn(params: dict[str, Any], data: DataInfo) -> keras.Model:
    """Conv → BatchNorm → ReLU → pool blocks, then Dropout and dense layers."""
    p = bp.SmallCNNParams.model_validate(params)
    if len(data.x_shape) != 3:
        raise ArchitectureError(f"small_cnn needs images [H, W, C], got samples {data.x_shape}")
    inputs = _inputs(data)
    h = inputs
    size = min(data.x_shape[:2])
    for i, filters in enumerate(p.filters):
        h = keras.layers.Conv2D(
            filters, p.kernel_size, padding="same", use_bias=False, name=f"conv_{i}"
        )(h)
        h = keras.layers.BatchNormalization(name=f"batch_norm_{i}")(h)
        h = keras.layers.ReLU(name=f"relu_{i}")(h)
        if size >= 4:
            h = keras.layers.MaxPooling2D(2, name=f"pool_{i}")(h)
            size //= 2
    h = keras.layers.GlobalAveragePooling2D(name="global_pool")(h)
    if p.dropout:
        h = keras.layers.Dropout(p.dropout, name="dropout")(h)
    if p.dense:
        h = keras.layers.Dense(p.dense, activation="relu", name="dense")(h)
    outputs = keras.layers.Dense(data.output_dim, name="output")(h)
    return keras.Model(inputs, outputs, name="small_cnn")


def _require_tokens(name: str, data: DataInfo) -> int:
    if data.vocab_size is None or len(data.x_shape) != 1:
        raise ArchitectureError(
            f"{name} needs token sequences [T] with a vocabulary (e.g. the token_sequences "
            f"generator), got samples {data.x_shape} of {data.x_dtype}"
        )
    return data.vocab_size


class PositionEmbedding(keras.layers.Layer):  # type: ignore[misc]
    """Adds a learned embedding of each position to the token embeddings."""

    def __init__(self, length: int, dim: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.length, self.dim = length, dim

    def build(self, input_shape: Any) -> None:
        self.positions = self.add_weight(
            shape=(self.length, self.dim), initializer="glorot_uniform", name="positions"
        )

    def call(self, x: Any) -> Any:
        return x + self.positions

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "length": self.length, "dim": self.dim}


def tiny_transformer(params: dict[str, Any], data: DataInfo) -> keras.Model:
    """Token + position embeddings, self-attention blocks, mean pooling, classifier."""
    p = bp.TinyTransformerParams.model_validate(params)
    vocab = _require_tokens("tiny_transformer", data)
    if p.embed_dim % p.num_heads:
        raise ArchitectureError("tiny_transformer: embed_dim must be divisible by num_heads")
    inputs = _inputs(data)
    h = keras.layers.Embedding(vocab, p.embed_dim, name="token_embedding")(inputs)
    h = PositionEmbedding(data.x_shape[0], p.embed_dim, name="position_embedding")(h)
    for i in range(p.num_blocks):
        attn = keras.layers.MultiHeadAttention(
            p.num_heads, p.embed_dim // p.num_heads, dropout=p.dropout, name=f"attention_{i}"
        )(h, h)
        h = keras.layers.LayerNormalization(name=f"norm_attn_{i}")(h + attn)
        ff = keras.layers.Dense(p.ff_dim, activation="relu", name=f"ff_in_{i}")(h)
        ff = keras.layers.Dense(p.embed_dim, name=f"ff_out_{i}")(ff)
        if p.dropout:
            ff = keras.layers.Dropout(p.dropout, name=f"dropout_{i}")(ff)
        h = keras.layers.LayerNormalization(name=f"norm_ff_{i}")(h + ff)
    h = keras.layers.GlobalAveragePooling1D(name="mean_pool")(h)
    outputs = keras.layers.Dense(data.output_dim, name="output")(h)
    return keras.Model(inputs, outputs, name="tiny_transformer")


def gru(params: dict[str, Any], data: DataInfo) -> keras.Model:
    """Token embedding, one GRU layer, classifier."""
    p = bp.GRUParams.model_validate(params)
    vocab = _require_tokens("gru", data)
    inputs = _inputs(data)
    h = keras.layers.Embedding(vocab, p.embed_dim, name="token_embedding")(inputs)
    h = keras.layers.GRU(p.units, name="gru")(h)
    if p.dropout:
        h = keras.layers.Dropout(p.dropout, name="dropout")(h)
    outputs = keras.layers.Dense(data.output_dim, name="output")(h)
    return keras.Model(inputs, outputs, name="gru")
