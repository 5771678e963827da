"""Fingerprints of live TensorFlow/Keras state equal those of the same values copied out."""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

from worker.fingerprint import fingerprint_arrays, fingerprint_state, training_state


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16", "int64", "bool"])
def test_zero_copy_reads_hash_like_numpy_copies(dtype: str) -> None:
    values = tf.cast(tf.reshape(tf.range(24), [4, 6]) % 5, dtype)
    variables = [
        ("tf/plain", tf.Variable(values)),
        ("keras/var", keras.Variable(values.numpy(), dtype=dtype, trainable=False)),
        ("tf/scalar", tf.Variable(tf.cast(3, dtype))),
        ("tf/empty", tf.Variable(tf.zeros([0, 3], dtype))),
    ]
    expected = fingerprint_arrays([(p, np.asarray(v.numpy())) for p, v in variables])
    assert fingerprint_state(variables) == expected


def test_a_snapshot_does_not_follow_later_updates() -> None:
    inputs = keras.Input((3,))
    model = keras.Model(inputs, keras.layers.Dense(2, name="d")(inputs))
    state = training_state(model)
    before = fingerprint_state(state)
    copies = [(p, np.array(v.numpy())) for p, v in state]
    state[0][1].assign_add(np.ones((3, 2), np.float32))
    assert fingerprint_arrays(copies) == before
    assert fingerprint_state(state) != before
