"""Wheels of user code built in memory for tests: valid ones, and ones with one thing wrong."""

from __future__ import annotations

import base64
import hashlib
import io
import zipfile

RING_ENTRY_POINTS = """\
[reprotrain.generators]
test_rings = ring_bundle.data:rings

[reprotrain.architectures]
test_ring_mlp = ring_bundle.model:ring_mlp
"""

DATA_PY = """\
from typing import Any

import tensorflow as tf

from worker.data.batch_source import BatchSource


def rings(params: dict[str, Any], *, batch_size: int) -> BatchSource:
    def rings_batch(indices: tf.Tensor, seed: tf.Tensor) -> Any:
        n = tf.shape(indices)[0]
        y = tf.random.stateless_uniform([n], seed=seed, minval=0, maxval=2, dtype=tf.int32)
        angle = tf.random.stateless_uniform([n], seed=seed + 1, maxval=6.28)
        radius = tf.where(y == 0, 1.0, 2.0)
        return tf.stack([radius * tf.cos(angle), radius * tf.sin(angle)], axis=1), y

    return BatchSource(rings_batch, num_classes=2)
"""

MODEL_PY = """\
from typing import Any

import keras


class Radial(keras.layers.Layer):
    def call(self, x: Any) -> Any:
        return keras.ops.concatenate([x, keras.ops.sum(x * x, axis=-1, keepdims=True)], axis=-1)


def ring_mlp(params: dict[str, Any], data: Any) -> Any:
    inputs = keras.Input(shape=data.x_shape)
    h = keras.layers.Dense(HIDDEN, activation="relu", name="hidden")(Radial(name="radial")(inputs))
    return keras.Model(inputs, keras.layers.Dense(data.output_dim, name="out")(h))


HIDDEN = 4
"""


def _record_line(path: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{path},sha256={digest},{len(data)}"


def make_wheel(
    files: dict[str, bytes],
    *,
    entry_points: str = RING_ENTRY_POINTS,
    name: str = "ring_bundle",
    version: str = "1.0",
    record_override: dict[str, bytes] | None = None,
    unlisted: dict[str, bytes] | None = None,
    metadata_headers: bytes = b"",
) -> bytes:
    """A wheel of `files` with METADATA, entry points and a RECORD of their digests;
    `record_override` lists other bytes in RECORD than the wheel holds, `unlisted` adds
    members RECORD does not name, `metadata_headers` more header lines to METADATA."""
    info = f"{name}-{version}.dist-info"
    members = dict(files)
    members[f"{info}/METADATA"] = (
        f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode() + metadata_headers
    )
    members[f"{info}/WHEEL"] = b"Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    members[f"{info}/entry_points.txt"] = entry_points.encode()
    recorded = {**members, **(record_override or {})}
    record = "\n".join(_record_line(p, d) for p, d in recorded.items()) + f"\n{info}/RECORD,,\n"
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for path, data in {**members, **(unlisted or {})}.items():
            zf.writestr(path, data)
        zf.writestr(f"{info}/RECORD", record)
    return buf.getvalue()


def ring_bundle(hidden: int = 4, **extra: bytes) -> bytes:
    """The test bundle: a generator and an architecture with a custom layer."""
    model = MODEL_PY.replace("HIDDEN = 4", f"HIDDEN = {hidden}").encode()
    return make_wheel(
        {
            "ring_bundle/__init__.py": b"",
            "ring_bundle/data.py": DATA_PY.encode(),
            "ring_bundle/model.py": model,
            **extra,
        }
    )


RING_SPEC = """
name: ring-bundle
seed: 5
dataset:
  generator: test_rings
  batch_size: 16
  train_batches: 4
model: {architecture: test_ring_mlp}
training:
  epochs: 2
  optimizer: {name: adam, params: {learning_rate: 0.01}}
  loss: {name: sparse_categorical_crossentropy, params: {from_logits: true}}
"""


def ring_spec(digest: str, extra: str = "") -> str:
    """The YAML spec training the test bundle's components from the bundle `digest`."""
    return RING_SPEC + f'code: "{digest}"\n' + extra
