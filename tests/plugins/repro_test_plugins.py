"""Test-only components, registered through the real entry-point mechanism by the tests."""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from worker.batch_source import BatchSource


def stateful_noise(params: dict[str, Any], *, batch_size: int) -> BatchSource:
    """Breaks the contract on purpose: draws from TensorFlow's stateful RNG."""

    def stateful_noise_batch(indices: tf.Tensor, seed: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        n = tf.shape(indices)[0]
        x = tf.random.uniform([n, 4])
        return x, tf.cast(x[:, 0] > 0.5, tf.int32)

    return BatchSource(stateful_noise_batch, num_classes=2)


def scalar_output(params: dict[str, Any], *, batch_size: int) -> BatchSource:
    """Breaks the contract on purpose: returns a scalar instead of a batch."""

    def scalar_output_batch(indices: tf.Tensor, seed: tf.Tensor) -> tf.Tensor:
        return tf.reduce_sum(tf.random.stateless_normal([4], seed=seed))

    return BatchSource(scalar_output_batch, num_classes=2)


def wide_mlp(params: dict[str, Any], data: Any) -> Any:
    """A third-party architecture: one hidden layer whose width comes from params."""
    import keras

    inputs = keras.Input(shape=data.x_shape, name="inputs")
    h = keras.layers.Dense(int(params.get("width", 16)), activation="relu", name="wide")(inputs)
    return keras.Model(inputs, keras.layers.Dense(data.output_dim, name="out")(h))
