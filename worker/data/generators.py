"""Built-in batch generators: stateless, vectorised TensorFlow functions of (indices, seed)."""

from __future__ import annotations

import math
from typing import Any

import tensorflow as tf

from worker.data.batch_source import BatchSource
from worker.models import builtin_params as bp


def _split(seed: tf.Tensor, n: int) -> list[tf.Tensor]:
    return list(tf.unstack(tf.random.experimental.stateless_split(seed, n)))


def _task_constant(shape: list[int], task_seed: int, salt: int) -> tf.Tensor:
    # Fixed by a params seed, not the run seed: it defines the task, like a dataset would.
    seed = tf.constant([task_seed, salt], tf.int64)
    return tf.constant(tf.random.stateless_normal(shape, seed=seed).numpy())


def gaussian_blobs(params: dict[str, Any], *, batch_size: int) -> BatchSource:
    """Classification: x ~ N(centre[y], spread²), y uniform over the classes."""
    p = bp.GaussianBlobsParams.model_validate(params)
    centers = _task_constant([p.num_classes, p.num_features], p.centers_seed, 0) * p.center_scale

    def gaussian_blobs_batch(indices: tf.Tensor, seed: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        n = tf.shape(indices)[0]
        s_label, s_noise = _split(seed, 2)
        y = tf.random.stateless_uniform(
            [n], seed=s_label, minval=0, maxval=p.num_classes, dtype=tf.int32
        )
        noise = tf.random.stateless_normal([n, p.num_features], seed=s_noise)
        return tf.gather(centers, y) + p.spread * noise, y

    return BatchSource(gaussian_blobs_batch, num_classes=p.num_classes)


def regression(params: dict[str, Any], *, batch_size: int) -> BatchSource:
    """Linear regression: y = x·W + noise, with W fixed by `weights_seed`."""
    p = bp.RegressionParams.model_validate(params)
    weights = _task_constant([p.num_features, p.targets], p.weights_seed, 1)

    def regression_batch(indices: tf.Tensor, seed: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        n = tf.shape(indices)[0]
        s_x, s_noise = _split(seed, 2)
        x = tf.random.stateless_normal([n, p.num_features], seed=s_x)
        noise = tf.random.stateless_normal([n, p.targets], seed=s_noise)
        return x, tf.matmul(x, weights) + p.noise * noise

    return BatchSource(regression_batch, num_classes=None)


def pattern_images(params: dict[str, Any], *, batch_size: int) -> BatchSource:
    """Images of noisy sine patterns; class 0 horizontal, 1 vertical, 2 diagonal, 3 rings."""
    p = bp.PatternImagesParams.model_validate(params)
    size = p.image_size
    axis = tf.linspace(0.0, 1.0, size)
    rows, cols = tf.meshgrid(axis, axis, indexing="ij")
    radius = tf.sqrt((rows - 0.5) ** 2 + (cols - 0.5) ** 2)
    # [4, H, W]: the coordinate each class's stripes run along.
    coords = tf.stack([rows, cols, (rows + cols) / math.sqrt(2.0), radius])[: p.num_classes]

    def pattern_images_batch(indices: tf.Tensor, seed: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        n = tf.shape(indices)[0]
        s_label, s_freq, s_phase, s_noise = _split(seed, 4)
        y = tf.random.stateless_uniform(
            [n], seed=s_label, minval=0, maxval=p.num_classes, dtype=tf.int32
        )
        freq = tf.random.stateless_uniform([n, 1, 1], seed=s_freq, minval=2.0, maxval=5.0)
        phase = tf.random.stateless_uniform([n, 1, 1], seed=s_phase, maxval=2 * math.pi)
        image = tf.sin(2 * math.pi * freq * tf.gather(coords, y) + phase)
        image = tf.repeat(image[..., tf.newaxis], p.channels, axis=-1)
        noise = tf.random.stateless_normal([n, size, size, p.channels], seed=s_noise)
        return image + p.noise * noise, y

    return BatchSource(pattern_images_batch, num_classes=p.num_classes)


def token_sequences(params: dict[str, Any], *, batch_size: int) -> BatchSource:
    """Token id sequences; the label is the class c whose tokens (id % classes == c) win."""
    p = bp.TokenSequencesParams.model_validate(params)

    def token_sequences_batch(indices: tf.Tensor, seed: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        n = tf.shape(indices)[0]
        tokens = tf.random.stateless_uniform(
            [n, p.seq_len], seed=seed, minval=0, maxval=p.vocab_size, dtype=tf.int32
        )
        counts = tf.reduce_sum(tf.one_hot(tokens % p.num_classes, p.num_classes), axis=1)
        return tokens, tf.argmax(counts, axis=-1, output_type=tf.int32)

    return BatchSource(token_sequences_batch, num_classes=p.num_classes, vocab_size=p.vocab_size)
