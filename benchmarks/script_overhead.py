"""Your own `model.fit` script with Reprotrain's two lines against the same script without.

One script, in fresh processes: an MLP (32 -> 256 -> 256 -> 10, Adam) trained by `model.fit`
on 12,800 synthetic rows, batch 64, 200 steps an epoch, 5 epochs, shuffled. Its epochs are
timed by a callback that starts first and one that ends last, so an epoch's time includes
whatever the other callbacks do at its end.

- measured: the script with `reprotrain.init()` and `run.keras_callback()`, run as a worker
  runs it (the run's seed and a checkpoint directory in its environment, progress lines
  on stderr): op determinism, a fingerprint at every epoch end, the epoch's checkpoint
  written, per-epoch reseeding.
- baselines: the same script without those two lines, (a) as it is (nothing set), (b) with
  op determinism and the seed set by hand.
- the data digested too: the script with `reprotrain.autolog()` (the callback added to
  `fit`, and each batch of its tf.data input digested as consumed) against the same
  script, fed the same tf.data pipeline, without Reprotrain.
- each with `steps_per_execution` 1 and 20.

Steps per second of the best epoch after the first; two processes per case (one in a quick
run), in one order and then the reverse, the faster counting (see keras_baseline.py).
Target: the script with Reprotrain >= 0.95 of (a), and with its data digested >= 0.95 of
the same tf.data script without Reprotrain.

    .venv/bin/python -m benchmarks --only script
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from benchmarks.rounds import progress
from benchmarks.rows import Row, write_json
from benchmarks.servers import REPO

TARGET = 0.95
STEPS_PER_EXECUTION = 20
MODES = {
    "reprotrain": "the script with reprotrain.init() and its callback, as a worker runs it",
    "plain": "the same script without them",
    "plain_deterministic": "the same script with op determinism set by hand",
    "reprotrain_data": "the script on a tf.data input with reprotrain.init() and "
    "reprotrain.autolog(), its batches digested, as a worker runs it",
    "plain_data": "the same tf.data script without them",
}
# (measured, baseline, whether the ratio has a target)
PAIRS = (
    ("reprotrain", "plain", True),
    ("reprotrain", "plain_deterministic", False),
    ("reprotrain_data", "plain_data", True),
)

SCRIPT = """\
import json, sys, time

mode, steps_per_execution, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
epochs, steps = int(sys.argv[4]), int(sys.argv[5])
if mode.startswith("reprotrain"):
    import reprotrain

    run = reprotrain.init(name="bench", seed=3)
    if mode == "reprotrain_data":
        reprotrain.autolog()

import keras
import numpy as np
import tensorflow as tf

if mode == "plain_deterministic":
    keras.utils.set_random_seed(3)
    tf.config.experimental.enable_op_determinism()
rows = 64 * steps
x = np.random.rand(rows, 32).astype("float32")
y = (np.random.rand(rows) * 10).astype("int32")
model = keras.Sequential(
    [
        keras.Input((32,)),
        keras.layers.Dense(256, activation="relu"),
        keras.layers.Dense(256, activation="relu"),
        keras.layers.Dense(10),
    ]
)
model.compile(
    optimizer=keras.optimizers.Adam(1e-3),
    loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    metrics=["accuracy"],
    steps_per_execution=steps_per_execution,
)
times = []


class Start(keras.callbacks.Callback):
    def on_epoch_begin(self, epoch, logs=None):
        self.t = time.perf_counter()


class End(keras.callbacks.Callback):
    def on_epoch_end(self, epoch, logs=None):
        times.append(time.perf_counter() - start.t)


start = Start()
ours = [run.keras_callback()] if mode == "reprotrain" else []
if mode.endswith("_data"):
    data = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(rows, seed=1).batch(64).prefetch(2)
    model.fit(data, epochs=epochs, callbacks=[start, End()], verbose=0)
else:
    model.fit(x, y, batch_size=64, epochs=epochs, callbacks=[start, *ours, End()], verbose=0)
with open(out, "w") as fh:
    json.dump({"epoch_s": times, "steps": steps}, fh)
"""


def _run(script: Path, mode: str, n: int, workdir: Path, epochs: int, steps: int) -> float:
    """Steps/s of the best epoch after the first, in a fresh process."""
    workdir.mkdir(parents=True)
    out = workdir / "times.json"
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "REPRO_SCRIPT_RUNS_DIR": str(workdir)}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
    if mode.startswith("reprotrain"):  # what a worker's job gives the script
        env.update(
            {
                "PYTHONHASHSEED": "0",
                "TF_DETERMINISTIC_OPS": "1",
                "REPRO_RUN_SEED": "3,0",
                "REPRO_RUN_SPEC_HASH": "sha256:" + "0" * 64,
                "REPRO_RUN_CHECKPOINT_DIR": str(workdir / "checkpoints"),
                "REPRO_RUN_PROGRESS": "1",
            }
        )
    done = subprocess.run(
        [sys.executable, str(script), mode, str(n), str(out), str(epochs), str(steps)],
        cwd=workdir,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    if done.returncode != 0:
        raise RuntimeError(f"{mode} (steps_per_execution {n}) failed:\n{done.stderr[-3000:]}")
    found = json.loads(out.read_text())
    return float(steps / min(found["epoch_s"][1:]))


def measure(quick: bool) -> list[Row]:
    epochs, steps = (3, 40) if quick else (5, 200)
    cases = [(mode, n) for n in (1, STEPS_PER_EXECUTION) for mode in MODES]
    order = cases if quick else [*cases, *reversed(cases)]
    found: dict[tuple[str, int], list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="reprotrain-bench-script-") as tmp:
        script = Path(tmp) / "train.py"
        script.write_text(SCRIPT)
        for i, (mode, n) in enumerate(order):
            progress(f"script: {mode}, steps_per_execution {n}")
            speed = _run(script, mode, n, Path(tmp) / f"{i}-{mode}-{n}", epochs, steps)
            found.setdefault((mode, n), []).append(speed)
    best = {case: max(speeds) for case, speeds in found.items()}
    rows = []
    for n in (1, STEPS_PER_EXECUTION):
        for measured, baseline, targeted in PAIRS:
            ours, theirs = best[measured, n], best[baseline, n]
            ratio = ours / theirs
            rows.append(
                Row(
                    section="script",
                    benchmark="your script's steps/s with Reprotrain vs without",
                    configuration=f"MLP 32-256-256-10, batch 64 x {steps} steps/epoch, "
                    f"steps_per_execution {n}: {MODES[measured]} vs {MODES[baseline]}",
                    unit="steps/s",
                    measured=ours,
                    baseline=theirs,
                    ratio=ratio,
                    target=f">= {TARGET:.2f}" if targeted else "",
                    met=(ratio >= TARGET) if targeted else None,
                    cause=""
                    if not targeted or ratio >= TARGET
                    else "the epoch end's fingerprint and checkpoint, and op determinism, "
                    "take more than 5% of an epoch"
                    + ("; each batch's digest on the input pipeline" if "data" in measured else ""),
                    params={
                        "steps_per_execution": n,
                        "baseline": baseline,
                        "processes_steps_per_s": found[measured, n],
                        "baseline_processes_steps_per_s": found[baseline, n],
                    },
                )
            )
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="3 epochs of 40 steps")
    parser.add_argument("--out", type=Path, help="write the rows here as JSON")
    args = parser.parse_args(argv)
    rows = measure(args.quick)
    if args.out is not None:
        write_json(args.out, rows)
    from benchmarks.rows import render_table

    print(render_table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
