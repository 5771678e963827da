"""Section 3a, fingerprinting: fingerprint_state against raw hashing of the same bytes.

Runs in its own process (started by run_all), so the 1 GB case's memory goes with it.
For each model size, an MLP `Input(w) -> Dense(w) x 4` with an Adam optimizer built on
it: the state a job fingerprints is the weights plus Adam's two moments, three times the
weights' bytes.

- measured: `fingerprint_state(training_state(model, optimizer))`, in bytes per second: every
  variable read by one `_ReadVariablesOp` (NumPy views, no copies), small variables in lanes
  of about equal bytes, one per core, each hash thread's lane handed over before the calling
  thread hashes its own; large ones by the hash's own threads.
- baseline: the same bytes already in memory as NumPy arrays (copies of the variables),
  each in turn through the hash object fingerprint.py picks for an array of that size (one
  thread below 4 MiB, all cores above). It skips the reads, the per-variable header and the
  combined digest.
  Before timing, the script checks that both give the same digests.
- also (info, at 100 MB): the same state read through `.numpy()`, which copies.

    .venv/bin/python -m benchmarks.fingerprinting --out rows.json
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from benchmarks.rounds import Timed, noisy, progress, time_round_robin
from benchmarks.rows import Row, write_json

if TYPE_CHECKING:
    from worker.record.variable_reads import TrainingState

TARGET = 0.8
DEPTH = 4


@dataclass(frozen=True)
class Size:
    weights_bytes: int  # the model's weights; the fingerprinted state is about three times that
    rounds: int
    budget_s: float


FULL = (
    Size(1_000_000, rounds=100, budget_s=3),  # 3 ms a round: more rounds, less noise
    Size(10_000_000, rounds=11, budget_s=5),
    Size(100_000_000, rounds=7, budget_s=10),
    Size(1_000_000_000, rounds=3, budget_s=15),
)
QUICK = (Size(1_000_000, rounds=1, budget_s=0), Size(4_000_000, rounds=1, budget_s=0))
MIN_CLEAN = 2
NUMPY_ROW_BYTES = 100_000_000  # the size at which the `.numpy()` read path is also shown


def width_for(weights_bytes: int) -> int:
    """Units per Dense layer so DEPTH layers of float32 weights and biases take about that."""
    return max(8, round(math.sqrt(weights_bytes / (4 * DEPTH))))


def build_state(width: int) -> tuple[TrainingState, int]:
    """An MLP with a built Adam optimizer: (its training state, bytes of model weights)."""
    import keras
    import numpy as np

    from worker.record.variable_reads import training_state

    keras.backend.clear_session()  # let the previous size's variables go
    keras.utils.set_random_seed(0)
    inputs = keras.Input((width,))
    x = inputs
    for _ in range(DEPTH):
        # Hashing speed does not depend on the values; random init of 1 GB takes seconds.
        x = keras.layers.Dense(width, kernel_initializer="ones")(x)
    model = keras.Model(inputs, x)
    optimizer = keras.optimizers.Adam()
    optimizer.build(model.trainable_variables)
    weights = sum(int(np.prod(v.shape)) * np.dtype(v.dtype).itemsize for v in model.variables)
    return training_state(model, optimizer), weights


def hash_arrays(arrays: Sequence[Any]) -> int:
    """Raw hashing: each array's bytes through the hash fingerprint.py picks for its size."""
    import numpy as np

    from worker.record.fingerprint import DEFAULT_ALGORITHM, new_hash

    for array in arrays:
        h = new_hash(DEFAULT_ALGORITHM, size_hint=array.nbytes)
        h.update(array.reshape(-1).view(np.uint8))
        h.digest()
    return sum(int(a.nbytes) for a in arrays)


def gap_cause(measured: Timed, baseline: Timed, reads: Timed, raw_tf: Timed, count: int) -> str:
    """The measured parts of the time fingerprint_state takes beyond raw hashing, and a fix."""
    gap = measured.best - baseline.best
    buffers = max(raw_tf.best - baseline.best, 0.0)
    rest = max(gap - reads.best - buffers, 0.0)
    parts = (
        f"{gap * 1e3:.2f} ms more than hashing: reading {count} variables "
        f"{reads.best * 1e3:.2f} ms, hashing TensorFlow's buffers instead of NumPy copies "
        f"{buffers * 1e3:.2f} ms, headers, digests and the rest {rest * 1e3:.2f} ms"
    )
    if reads.best >= max(buffers, rest):
        return parts + (
            "; the reads are one eager op for every variable, done before any hashing starts"
        )
    if buffers >= rest:
        return parts + "; TensorFlow's buffers hash slower (memory placement), not fixable here"
    return parts + (
        "; most of it is neither the reads nor the buffers but the per-variable work and "
        "run-to-run variation, which no single change removes"
    )


def measure_size(size: Size, *, min_clean: int) -> list[Row]:
    from worker.record.fingerprint import fingerprint_arrays, fingerprint_state
    from worker.record.variable_reads import read_state

    state, weights = build_state(width_for(size.weights_bytes))
    # `.numpy()` copies: the baseline hashes NumPy-owned memory holding the same bytes.
    arrays = [v.numpy() for _, v in state]
    total = int(sum(a.nbytes for a in arrays))
    expected = fingerprint_arrays((p, a) for (p, _), a in zip(state, arrays, strict=True))
    if fingerprint_state(state) != expected:
        raise RuntimeError("fingerprint_state did not hash the bytes of the baseline")

    def run_fingerprint() -> int:
        fingerprint_state(state)
        return total

    def run_via_numpy() -> int:
        fingerprint_arrays((path, v.numpy()) for path, v in state)
        return total

    # What the gap is made of: the reads alone, and the baseline's hashing of the very
    # buffers fingerprint_state reads (TensorFlow's, not NumPy copies).
    def run_reads() -> int:
        return sum(int(a.nbytes) for a in read_state(state))

    views = read_state(state)
    measured = Timed("fingerprint_state", run_fingerprint, total)
    baseline = Timed("raw hash", lambda: hash_arrays(arrays), total)
    reads = Timed("reads", run_reads, total)
    raw_tf = Timed("raw hash of TensorFlow's buffers", lambda: hash_arrays(views), total)
    cases = [baseline, measured, reads, raw_tf]
    via_numpy = None
    if size.weights_bytes == NUMPY_ROW_BYTES:
        via_numpy = Timed("via .numpy()", run_via_numpy, total)
        cases.append(via_numpy)
    label = f"{weights / 1e6:,.0f} MB of weights" if weights >= 1e6 else f"{weights:,} B"
    progress(f"fingerprinting: {label} ({total / 1e6:,.0f} MB of state), >= {size.rounds} rounds")
    time_round_robin(cases, size.rounds, min_clean=min_clean, budget_s=size.budget_s)

    ratio = measured.rate / baseline.rate
    params = {"weights_bytes": weights, "state_bytes": total}
    rows = [
        Row(
            section="fingerprint",
            benchmark="fingerprint vs raw hashing",
            configuration=f"MLP, {label} + Adam ({total / 1e6:,.0f} MB hashed)",
            unit="B/s",
            measured=measured.rate,
            baseline=baseline.rate,
            ratio=ratio,
            target=f">= {TARGET:.2f}",
            met=ratio >= TARGET,
            noisy=noisy(measured, baseline, min_clean=min_clean),
            cause=""
            if ratio >= TARGET
            else gap_cause(measured, baseline, reads, raw_tf, len(state)),
            params={
                **params,
                "read": "read_value",
                "reads_s": reads.best,
                "raw_tensorflow_buffers_s": raw_tf.best,
            },
        )
    ]
    if via_numpy is not None:
        rows.append(
            Row(
                section="fingerprint",
                benchmark="fingerprint vs raw hashing",
                configuration=f"same state read with .numpy() (copies), {label}",
                unit="B/s",
                measured=via_numpy.rate,
                baseline=baseline.rate,
                ratio=via_numpy.rate / baseline.rate,
                noisy=noisy(via_numpy, baseline, min_clean=min_clean),
                params={**params, "read": "numpy"},
            )
        )
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes: a smoke run")
    parser.add_argument("--out", type=Path, required=True, help="write the rows here (JSON)")
    args = parser.parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    rows: list[Row] = []
    for size in QUICK if args.quick else FULL:
        rows += measure_size(size, min_clean=0 if args.quick else MIN_CLEAN)
    write_json(args.out, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
