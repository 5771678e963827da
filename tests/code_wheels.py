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


# Hostile bundles: each wraps the test generator with something done when the job builds it.
_HOSTILE_DATA_PY = '''
import json
import os
import subprocess
import sys


def _argument(name: str) -> str:
    return sys.argv[sys.argv.index(name) + 1]


def linked_rings(params: dict[str, Any], *, batch_size: int) -> BatchSource:
    """Checkpoint files that are links to a file of the host, announced as a checkpoint."""
    checkpoints = _argument("--checkpoint-dir")
    for suffix in ("npz", "json"):
        link = os.path.join(checkpoints, f"step-000000001.{suffix}")
        if not os.path.lexists(link):
            os.symlink(TARGET, link)
    event = {"event": "checkpoint", "path": "step-000000001.json", "step": 1}
    sys.stderr.write("@repro " + json.dumps(event) + "\\n")
    sys.stderr.flush()
    return rings(params, batch_size=batch_size)


DAEMON = """
import glob, json, os, sys, time
runs, marker = sys.argv[1], sys.argv[2]
with open(marker + ".tmp", "w") as fh:
    fh.write(str(os.getpid()))
os.replace(marker + ".tmp", marker)
end = time.time() + 300
while time.time() < end:
    for path in glob.glob(os.path.join(runs, "*", "attempt-*", "result.json")):
        try:
            with open(path) as fh:
                doc = json.load(fh)
            for epoch in doc.get("metrics", []):
                epoch.update({k: 0.001 for k in epoch if k.endswith("loss")})
            with open(path, "w") as fh:
                json.dump(doc, fh)
        except Exception:
            pass
    time.sleep(0.01)
"""
LAUNCHER = (
    "import subprocess, sys; subprocess.Popen([sys.executable, '-c', *sys.argv[1:]], "
    "start_new_session=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, "
    "stderr=subprocess.DEVNULL)"
)


def daemon_rings(params: dict[str, Any], *, batch_size: int) -> BatchSource:
    """A daemon (setsid, double fork) that outlives the job, rewriting every result.json
    of the worker's runs it finds; its pid goes to TARGET once it runs."""
    runs = os.path.dirname(os.path.dirname(os.path.dirname(_argument("--out"))))
    quiet = subprocess.DEVNULL
    if os.path.exists(TARGET):  # built once already
        return rings(params, batch_size=batch_size)
    subprocess.run(
        [sys.executable, "-c", LAUNCHER, DAEMON, runs, TARGET],
        start_new_session=True, stdin=quiet, stdout=quiet, stderr=quiet, check=True,
    )
    for _ in range(3000):  # the job goes on only once the daemon runs
        if os.path.exists(TARGET):
            break
        __import__("time").sleep(0.01)
    return rings(params, batch_size=batch_size)
'''


def hostile_bundle(generator: str, target: str) -> bytes:
    """The test bundle with its generator replaced by `linked_rings` (checkpoints linked to
    the host file `target`) or `daemon_rings` (a daemon writing its pid to `target`)."""
    data = DATA_PY + f"\nTARGET = {target!r}\n" + _HOSTILE_DATA_PY
    return make_wheel(
        {
            "ring_bundle/__init__.py": b"",
            "ring_bundle/data.py": data.encode(),
            "ring_bundle/model.py": MODEL_PY.encode(),
        },
        entry_points=RING_ENTRY_POINTS.replace("data:rings", f"data:{generator}"),
    )
