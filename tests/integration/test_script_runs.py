"""Your own training script, made reproducible by `reprotrain.init()`: the two example
scripts (a Keras `model.fit` on scikit-learn's digits, a custom `GradientTape` loop), each
run twice in fresh interpreters, record the same trace point for point; another seed
records another one from initialisation on. The record holds what a run needs to be
checked: the seed, the script's digest and arguments, params, what was made deterministic
(the script was started again with PYTHONHASHSEED=0), provenance, per-epoch metrics and the
data each epoch trained on; and it warns of randomness it cannot control."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from worker.record.trace import compare_traces

pytestmark = pytest.mark.slow

SCRIPTS = Path(__file__).resolve().parents[2] / "examples" / "scripts"


def _run_script(
    script: str, runs: Path, *args: str, env: dict[str, str] | None = None
) -> dict[str, Any]:
    """Run an example as a user would (`python script.py ...`); its one new record."""
    before = set(runs.glob("*/run.json")) if runs.exists() else set()
    environ = {k: v for k, v in os.environ.items() if k != "PYTHONHASHSEED"}
    environ.update({"REPRO_SCRIPT_RUNS_DIR": str(runs), "TF_CPP_MIN_LOG_LEVEL": "2"})
    env = {**environ, **(env or {})}
    done = subprocess.run(
        [sys.executable, str(SCRIPTS / script), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        cwd=runs.parent,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    (new,) = set(runs.glob("*/run.json")) - before
    record: dict[str, Any] = json.loads(new.read_text())
    return record


def test_the_keras_fit_example_records_the_same_trace_twice(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    first = _run_script("fit_digits.py", runs, "--epochs", "2")
    again = _run_script("fit_digits.py", runs, "--epochs", "2")
    other_seed = _run_script("fit_digits.py", runs, "--epochs", "2", "--seed", "43")

    assert first["status"] == again["status"] == "succeeded"
    assert [p["kind"] for p in first["trace"]] == ["init", "epoch", "epoch"]
    same = compare_traces(first["trace"], again["trace"])
    assert same.identical, same
    assert first["final_fingerprint"] == again["final_fingerprint"]
    differ = compare_traces(first["trace"], other_seed["trace"])
    assert not differ.identical and differ.first_divergence is not None
    assert differ.first_divergence.point.kind == "init"  # another seed: other initial weights

    assert first["seed"] == [42, 0] and other_seed["seed"] == [43, 0]
    assert first["params"] == {"epochs": 2, "lr": 0.003, "width": 16, "seed": 42}
    assert first["script"]["args"] == ["--epochs", "2"]
    assert first["script"]["sha256"] == again["script"]["sha256"]
    # Started again with what determinism needs before any of the script's own code ran.
    assert first["determinism"]["op_determinism"] is True
    assert first["determinism"]["python_hash_seed"] == "0"
    assert first["provenance"]["python"]["hash_randomization"] == 0
    assert first["provenance"]["libraries"]["tensorflow"] == "2.21.0"
    by_epoch = {(m["name"], m["epoch"]) for m in first["metrics"]}
    assert {("accuracy", 1), ("val_accuracy", 2), ("loss", 2)} <= by_epoch
    assert first["metrics"] == again["metrics"]
    # reprotrain.autolog(): the arrays fit was given, digested whole, stand for each epoch.
    data = [d["epoch"] for d in first["data_fingerprints"]]
    assert data == [1, 2] and first["data_fingerprints"] == again["data_fingerprints"]


def test_the_gradient_tape_example_records_the_same_trace_twice(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    first = _run_script("gradient_tape.py", runs, "--epochs", "2")
    again = _run_script("gradient_tape.py", runs, "--epochs", "2")
    assert first["status"] == again["status"] == "succeeded"
    assert [(p["kind"], p["epoch"]) for p in first["trace"]] == [
        ("init", 0),
        ("epoch", 1),
        ("epoch", 2),
    ]
    assert first["trace"] == again["trace"]
    assert [m["name"] for m in first["metrics"]] == ["loss", "loss"]
    # run.dataset: each epoch's batches, digested as the loop took them (reshuffled each
    # epoch, so the two epochs' fingerprints differ).
    data = first["data_fingerprints"]
    assert [d["epoch"] for d in data] == [1, 2] and data[0]["fingerprint"] != data[1]["fingerprint"]
    assert data == again["data_fingerprints"]


CHANGED_DATA = """
import os
import sys

import reprotrain

run = reprotrain.init(project="t", name="data", seed=1)
reprotrain.autolog()

import keras
import numpy as np
import tensorflow as tf

x = np.linspace(-1, 1, 128, dtype="float32").reshape(32, 4) * float(sys.argv[1])
y = (x.sum(axis=1) > 0).astype("int32")
data = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(32, seed=3).batch(8).prefetch(4)
model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
model.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
model.fit(data, epochs=2, verbose=0)

np.random.default_rng()  # fresh entropy: warned of
child = os.fork()  # as a multiprocessing data loader does: warned of
if child == 0:
    os._exit(0)
os.waitpid(child, 0)
"""


def test_autolog_digests_a_dataset_as_fit_consumes_it_and_warns_of_what_it_cannot_control(
    tmp_path: Path,
) -> None:
    script = tmp_path / "changed_data.py"
    script.write_text(CHANGED_DATA)
    runs = tmp_path / "runs"
    first = _run_script(str(script), runs, "1.0")
    again = _run_script(str(script), runs, "1.0")
    scaled = _run_script(str(script), runs, "2.0")

    assert [(p["kind"], p["epoch"], p["step"]) for p in first["trace"]] == [
        ("init", 0, 0),
        ("epoch", 1, 4),
        ("epoch", 2, 8),
    ]
    assert first["trace"] == again["trace"]
    assert first["data_fingerprints"] == again["data_fingerprints"]
    # Other data, the same model: equal at initialisation, the data differs from epoch 1.
    assert scaled["trace"][0] == first["trace"][0]
    assert scaled["trace"][1]["fingerprint"] != first["trace"][1]["fingerprint"]
    ours = {d["epoch"]: d["fingerprint"] for d in first["data_fingerprints"]}
    theirs = {d["epoch"]: d["fingerprint"] for d in scaled["data_fingerprints"]}
    assert sorted(ours) == [1, 2] and ours[1] != theirs[1]

    said = " | ".join(first["warnings"])
    assert "np.random.default_rng() was called without a seed" in said
    assert "the script forked a process" in said
    assert len(first["warnings"]) == 2, first["warnings"]  # the child wrote nothing over it
    assert first["status"] == "succeeded"


@pytest.mark.parametrize("script", ["fit_digits.py", "gradient_tape.py"])
def test_a_run_resumed_from_its_epoch_2_checkpoint_ends_as_the_whole_run(
    script: str, tmp_path: Path
) -> None:
    """As a worker runs a script: the run's seed, spec hash and checkpoint directory in the
    environment. The whole run keeps a checkpoint per epoch; with those of epochs 3 and 4
    removed, a resumed run restores epoch 2 (the callback itself, or the loop's
    `run.restore`) and records the rest of the trace bit for bit."""
    checkpoints = tmp_path / "checkpoints"
    env = {
        "REPRO_RUN_SEED": "5,0",
        "REPRO_RUN_SPEC_HASH": "sha256:" + "1" * 64,
        "REPRO_RUN_CHECKPOINT_DIR": str(checkpoints),
    }
    whole = _run_script(script, tmp_path / "runs", "--epochs", "4", env=env)
    assert whole["checkpoints"] == [f"epoch-{e:06d}.json" for e in (1, 2, 3, 4)]
    for epoch in (3, 4):
        for suffix in ("json", "npz"):
            (checkpoints / f"epoch-{epoch:06d}.{suffix}").unlink()

    resumed = _run_script(
        script, tmp_path / "runs", "--epochs", "4", env={**env, "REPRO_RUN_RESUME": "1"}
    )
    assert resumed["resumed_from_epoch"] == 2
    assert resumed["trace"] == whole["trace"]
    assert resumed["final_fingerprint"] == whole["final_fingerprint"]
    assert resumed["data_fingerprints"] == whole["data_fingerprints"]
    assert [d["epoch"] for d in whole["data_fingerprints"]] == [1, 2, 3, 4]
    assert [m["epoch"] for m in resumed["metrics"]] == [m["epoch"] for m in whole["metrics"]]
