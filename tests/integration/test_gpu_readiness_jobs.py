"""TF32 and the step pre-flight in real job processes on the CPU."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.integration.jobs import blobs_spec, run_job
from worker.compare.verdict import build_report, record_from_result

pytestmark = pytest.mark.slow

CLOCK_MODULE = '''
import keras
import tensorflow as tf


class Clock(keras.layers.Layer):
    """Adds nothing, but reads the clock inside the compiled step."""

    def call(self, x):
        return x + tf.cast(tf.timestamp(), x.dtype) * 0.0


def clock_mlp(params, data):
    inputs = keras.Input(shape=data.x_shape)
    hidden = Clock(name="clock")(keras.layers.Dense(8, name="hidden")(inputs))
    return keras.Model(inputs, keras.layers.Dense(data.output_dim, name="out")(hidden))
'''


def _small(**changes: Any) -> dict[str, Any]:
    spec = blobs_spec()
    spec["dataset"] = {**spec["dataset"], "train_batches": 3, "eval_batches": 1}
    spec["training"] = {**spec["training"], "epochs": 1}
    spec.update(changes)
    return spec


def test_tf32_off_and_default_both_train_record_it_and_compare_names_it(tmp_path: Path) -> None:
    off = run_job(_small(determinism={"tf32": False}), tmp_path / "off")
    default = run_job(_small(), tmp_path / "default")
    assert off.returncode == 0 and default.returncode == 0, (off.stderr[-2000:], default.stderr)
    assert off.result.provenance["determinism"]["tf32"] is False
    # Null leaves TensorFlow's default, recorded as what it resolved to (on for this build).
    assert default.result.provenance["determinism"]["tf32"] is True
    report = build_report(
        record_from_result(default.result, "a"), record_from_result(off.result, "b")
    )
    named = [d for d in report["provenance_diff"] if d["field"] == "determinism.tf32"]
    assert named and named[0]["breaks_reproducibility"] is True
    assert "TF32" in named[0]["why"]
    assert any(d["path"] == "determinism.tf32" for d in report["spec_diff"])


@pytest.mark.parametrize("steps_per_execution", [1, 3])
def test_a_step_refused_under_op_determinism_fails_before_training_naming_the_layer(
    tmp_path: Path, steps_per_execution: int
) -> None:
    site = tmp_path / "site"
    info = site / "clock_plugin-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: clock-plugin\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(
        "[reprotrain.architectures]\nclock_mlp = clock_plugin:clock_mlp\n"
    )
    (site / "clock_plugin.py").write_text(CLOCK_MODULE)
    spec = _small(model={"architecture": "clock_mlp", "params": {}})
    # Several steps a call: the pre-flight runs the loop the epochs call, once.
    spec["training"] = {**spec["training"], "steps_per_execution": steps_per_execution}
    done = run_job(spec, tmp_path / "job", extra_paths=[site])
    assert done.returncode != 0
    error = done.result.error
    assert error is not None, done.stderr[-3000:]
    assert "training step runs Timestamp" in error.message
    assert "layer 'clock'" in error.message
    assert "clock_plugin.py" in error.message  # where the op was made
    assert not any(e.get("event") == "epoch_start" for e in done.events)
