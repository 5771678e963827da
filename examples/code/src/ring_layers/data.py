"""A generator: points on two noisy rings, labelled by ring. Stateless RNG ops only, so any
batch of any epoch can be regenerated from its seed."""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from worker.data.batch_source import BatchSource


def rings(params: dict[str, Any], *, batch_size: int) -> BatchSource:
    """Two rings of radius 1 and `outer`, with Gaussian noise of `noise`."""
    outer = float(params.get("outer", 2.0))
    noise = float(params.get("noise", 0.1))

    def rings_batch(indices: tf.Tensor, seed: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        n = tf.shape(indices)[0]
        s_label, s_angle, s_noise = (
            tf.random.experimental.stateless_split(seed, 3)[i] for i in range(3)
        )
        y = tf.random.stateless_uniform([n], seed=s_label, minval=0, maxval=2, dtype=tf.int32)
        angle = tf.random.stateless_uniform([n], seed=s_angle, maxval=6.283185307179586)
        radius = tf.where(y == 0, 1.0, outer)
        points = tf.stack([radius * tf.cos(angle), radius * tf.sin(angle)], axis=1)
        return points + noise * tf.random.stateless_normal([n, 2], seed=s_noise), y

    return BatchSource(rings_batch, num_classes=2)
