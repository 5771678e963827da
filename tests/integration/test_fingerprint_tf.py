"""Fingerprints of live TensorFlow/Keras state equal those of the same values copied out."""

from __future__ import annotations

from typing import Any

import keras
import numpy as np
import pytest
import tensorflow as tf

from worker.models import registry
from worker.record import fingerprint, variable_reads
from worker.record.fingerprint import (
    StateFingerprint,
    combine,
    fingerprint_arrays,
    fingerprint_state,
    variable_digest,
)
from worker.record.variable_reads import TrainingState, training_state
from worker.spec import parse_spec
from worker.training.job import Job


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


@pytest.mark.parametrize("pool_min_bytes", [None, 0])
def test_later_fingerprints_of_a_training_state_read_the_values_then(
    pool_min_bytes: int | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """From its second fingerprint on, a TrainingState is read by one op and hashed in the
    lanes planned at its first: each fingerprint must be that of the values at the call."""
    if pool_min_bytes is not None:
        monkeypatch.setattr(fingerprint, "_POOL_MIN_BYTES", pool_min_bytes)
    inputs = keras.Input((64,))
    model = keras.Model(inputs, keras.layers.Dense(300, name="d")(inputs))
    optimizer = keras.optimizers.Adam()
    optimizer.build(model.trainable_variables)
    state = training_state(model, optimizer)
    seen = set()
    for step in range(4):
        copies = [(p, np.array(v.numpy())) for p, v in state]
        got = fingerprint_state(state)
        assert got == fingerprint_arrays(copies)
        seen.add(got.fingerprint)
        for _, variable in state:
            if variable.dtype == "float32" and len(variable.shape) == 2:
                variable.assign_add(np.full(variable.shape, step + 1, np.float32))
    assert len(seen) == 4


def test_from_its_second_read_on_a_training_state_is_read_by_one_op_as_snapshots() -> None:
    """The second and later reads take every variable with one `_ReadVariablesOp` (a
    TensorFlow update that dropped it would fall back to one op each, silently slower):
    the arrays must be the values at the call, of every dtype, and stay so after updates."""
    dtypes = ["float32", "float16", "bfloat16", "int64", "bool"]
    state = TrainingState(
        (f"v/{dtype}", tf.Variable(tf.cast(tf.reshape(tf.range(12), [3, 4]) % 3, dtype)))
        for dtype in dtypes
    )
    variable_reads.read_state(state)  # the first read finds the handles
    assert state._handles is not None and all(h is not None for h in state._handles)
    together = variable_reads._read_all([h for h in state._handles if h is not None])
    assert together is not None
    copies = [np.array(v.numpy()) for _, v in state]
    for read in (together, variable_reads.read_state(state)):
        assert [a.dtype for a in read] == [c.dtype for c in copies]
        assert all(np.array_equal(a, c) for a, c in zip(read, copies, strict=True))
    for (_, variable), dtype in zip(state, dtypes, strict=True):
        variable.assign(tf.cast(tf.fill([3, 4], 2), dtype))
    assert all(np.array_equal(a, c) for a, c in zip(together, copies, strict=True))
    assert fingerprint_state(state) == fingerprint_arrays((p, v.numpy()) for p, v in state)


# One small spec per built-in architecture, with a generator whose samples it takes.
_TOKENS = {"generator": "token_sequences", "params": {"vocab_size": 16, "seq_len": 8}}
ARCHITECTURE_SPECS: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    "mlp": (
        {"generator": "gaussian_blobs", "params": {"num_features": 6, "num_classes": 3}},
        {"hidden": [16, 8], "batch_norm": True, "dropout": 0.1},
    ),
    "small_cnn": (
        {"generator": "pattern_images", "params": {"image_size": 8, "channels": 1}},
        {"filters": [4, 8], "dense": 8},
    ),
    "tiny_transformer": (_TOKENS, {"embed_dim": 8, "num_heads": 2, "ff_dim": 16}),
    "gru": (_TOKENS, {"embed_dim": 8, "units": 8}),
}


def _trained_job(architecture: str) -> Job:
    dataset, model_params = ARCHITECTURE_SPECS[architecture]
    spec = parse_spec(
        {
            "name": f"fingerprint-{architecture}",
            "seed": 5,
            "dataset": {**dataset, "batch_size": 8, "train_batches": 2},
            "model": {"architecture": architecture, "params": model_params},
            "training": {
                "epochs": 1,
                "loss": {
                    "name": "sparse_categorical_crossentropy",
                    "params": {"from_logits": True},
                },
            },
        }
    )
    job = Job(spec, (5, 0))
    # Two steps, so optimizer moments and BatchNorm statistics hold values, not zeros.
    for batch_id in range(2):
        x, y = job.data.make_batch(batch_id)
        job.train_step(x, y)
    return job


def test_every_builtin_architecture_has_a_spec_here() -> None:
    builtin = {
        c.name for c in registry.components("architecture").values() if c.source == "builtin"
    }
    # `keras` builds whatever stored definition a spec names: its runs are fingerprinted in
    # tests/integration/test_model_definitions_e2e.py.
    assert set(ARCHITECTURE_SPECS) == builtin - {"keras"}


@pytest.mark.parametrize("architecture", sorted(ARCHITECTURE_SPECS))
@pytest.mark.parametrize("pool_min_bytes", [None, 0])
def test_fast_reads_and_threaded_hashing_equal_the_reference_digests(
    architecture: str, pool_min_bytes: int | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """fingerprint_state equals digests of `.numpy()` copies hashed one by one, in order.

    `pool_min_bytes=0` hands even these small models' variables to the hash threads, in
    lanes; None keeps the default, which hashes them on the calling thread.
    """
    if pool_min_bytes is not None:
        monkeypatch.setattr(fingerprint, "_POOL_MIN_BYTES", pool_min_bytes)
    job = _trained_job(architecture)
    copies = [(path, np.array(v.numpy())) for path, v in job.state]
    digests = {path: variable_digest(path, array) for path, array in copies}
    expected = StateFingerprint(combine(digests.items()), digests)
    assert len(digests) == len(job.state) > 4
    for _ in range(3):
        assert fingerprint_state(job.state) == expected
    assert fingerprint_state(job.state, "sha256") == fingerprint_arrays(copies, "sha256")


def test_large_and_small_variables_together_keep_their_order() -> None:
    # From 4 MiB a variable is hashed by blake3's own threads after the small ones: the
    # fingerprint must still list and combine every variable in state order.
    variables = [
        ("big", tf.Variable(tf.reshape(tf.range(1 << 21, dtype=tf.float32), [1024, 2048]))),
        ("small", tf.Variable(tf.ones([300, 300]))),
        ("tiny", tf.Variable(tf.constant(7, tf.int64))),
        ("big2", tf.Variable(tf.fill([1 << 21], 0.5))),
    ]
    copies = [(p, np.array(v.numpy())) for p, v in variables]
    digests = {path: variable_digest(path, array) for path, array in copies}
    got = fingerprint_state(variables)
    assert list(got.variables) == ["big", "small", "tiny", "big2"]
    assert got == StateFingerprint(combine(digests.items()), digests)
