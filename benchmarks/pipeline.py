"""Section 1, the input pipeline: StatelessRngDataset against the fused-op ceiling.

Runs in its own process, started by run_all once per core configuration: `--cores 1` pins
the process to one CPU before TensorFlow starts, so TensorFlow sizes its thread pools and
tf.data's AUTOTUNE to that one CPU. Op determinism is on for every case, as in a job.

- measured (information, no longer a target: at batch 64 on 2 cores it measured 0.64-0.84
  of the fused op, out of reach of a tf.data pipeline on these machines):
  `StatelessRngDataset(..., num_parallel_calls=AUTOTUNE, prefetch=AUTOTUNE,
  deterministic_order=True).as_dataset()` consumed inside a tf.function (a loop over the
  dataset in the compiled function, no Python work per element): in-graph consumption, as
  a job's `training.steps_per_execution` loop consumes the dataset; every value is counted.
- baseline (the ceiling): the same number of values with the same dtypes from one stateless
  op per output, computed before the eager op returns and viewed by NumPy without a copy.
- also (info): the same dataset iterated in a Python loop, as a one-step-per-call loop
  consumes it; the same dataset with a serial map (one generator call at a time), consumed
  in a tf.function, which says what the map's parallel calls add; and the conventional
  pipeline, a tf.data map drawing from the stateful global RNG (`tf.random.normal`/
  `uniform`), which op determinism runs serially.

    .venv/bin/python -m benchmarks.pipeline --cores all --out rows.json
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from benchmarks.rounds import Timed, noisy, progress, time_round_robin
from benchmarks.rows import Row, write_json

NUM_CLASSES = 10
SEED = (20240611, 7)


@dataclass(frozen=True)
class Config:
    features: int
    total_rows: int  # rows per pass: a multiple of every batch size
    batch_sizes: tuple[int, ...]
    rounds: int
    min_clean: int
    budget_s: float
    # The Python-loop and serial-map rows (information) on this many cores or more only:
    # the Python loop is the slowest pass and the 2-core rows already show what a Python
    # consumer costs; on one core a serial map is what a parallel one is.
    python_loop_min_cores: int = 2


# Three rounds after the warm-up: the best of them moved by at most a few points against
# four rounds in repeated full runs, and the whole benchmark has a 10-minute budget.
FULL = Config(
    features=256,
    total_rows=1 << 17,  # 33.7 M values a pass: 0.25-0.5 s for the fused op
    batch_sizes=(64, 256, 1024, 4096),
    rounds=3,
    min_clean=2,
    budget_s=15,
)
QUICK = Config(
    features=32,
    total_rows=1 << 12,
    batch_sizes=(64, 256),
    rounds=1,
    min_clean=0,
    budget_s=0,
    python_loop_min_cores=1,
)


def pin_to_one_cpu() -> int:
    """Restrict this process to its lowest allowed CPU (before TensorFlow starts)."""
    cpu = min(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {cpu})
    return cpu


def measure(cfg: Config, *, cores_label: str) -> list[Row]:
    import numpy as np
    import tensorflow as tf

    from worker.data.stateless_dataset import AUTOTUNE, StatelessRngDataset

    tf.config.experimental.enable_op_determinism()
    cores = len(os.sched_getaffinity(0))
    values_per_row = cfg.features + 1
    total_values = cfg.total_rows * values_per_row

    def stateless_batch(indices: Any, seed: Any) -> tuple[Any, Any]:
        n = tf.shape(indices)[0]
        s_x, s_y = tf.unstack(tf.random.experimental.stateless_split(seed, 2))
        x = tf.random.stateless_normal([n, cfg.features], seed=s_x)
        y = tf.random.stateless_uniform([n], seed=s_y, minval=0, maxval=NUM_CLASSES, dtype=tf.int32)
        return x, y

    def run_fused() -> int:
        s_x, s_y = tf.unstack(tf.random.experimental.stateless_split(tf.constant(SEED, tf.int64)))
        x = tf.random.stateless_normal([cfg.total_rows, cfg.features], seed=s_x)
        y = tf.random.stateless_uniform(
            [cfg.total_rows], seed=s_y, minval=0, maxval=NUM_CLASSES, dtype=tf.int32
        )
        # np.asarray views a CPU tensor without copying: it waits for the op, adds nothing.
        return int(np.asarray(x).size + np.asarray(y).size)

    def consume(ds: Any) -> int:
        values = 0
        for x, y in ds:
            values += x.shape.num_elements() + y.shape.num_elements()
        return values

    def in_graph_consumer(ds: Any) -> Callable[[], int]:
        def count_values() -> Any:
            values = tf.constant(0, tf.int64)
            for x, y in ds:
                values += tf.size(x, out_type=tf.int64) + tf.size(y, out_type=tf.int64)
            return values

        compiled = tf.function(count_values)
        return lambda: int(compiled())

    def conventional(batch_size: int) -> Any:
        tf.random.set_seed(SEED[0])

        def draw(_: Any) -> tuple[Any, Any]:
            x = tf.random.normal([batch_size, cfg.features])
            y = tf.random.uniform([batch_size], 0, NUM_CLASSES, dtype=tf.int32)
            return x, y

        ds = tf.data.Dataset.range(cfg.total_rows // batch_size)
        ds = ds.map(draw, num_parallel_calls=AUTOTUNE, deterministic=True)
        return ds.prefetch(AUTOTUNE)

    fused = Timed("fused op", run_fused, total_values)
    cases: list[tuple[int, str, Timed]] = []
    for batch_size in cfg.batch_sizes:
        data = StatelessRngDataset(
            stateless_batch,
            batch_size=batch_size,
            num_batches=cfg.total_rows // batch_size,
            base_seed=SEED,
            num_parallel_calls=AUTOTUNE,
            prefetch_buffer=AUTOTUNE,
            deterministic_order=True,
        )
        ds = data.as_dataset()
        runs: dict[str, Callable[[], int]] = {
            "in_graph": in_graph_consumer(ds),
            "stateless": partial(consume, ds),
            "serial": in_graph_consumer(
                data.with_options(num_parallel_calls=None, prefetch_buffer=AUTOTUNE).as_dataset()
            ),
            "stateful": partial(consume, conventional(batch_size)),
        }
        if cores < cfg.python_loop_min_cores:
            del runs["stateless"], runs["serial"]
        for kind, run in runs.items():
            cases.append(
                (batch_size, kind, Timed(f"{kind}, batch {batch_size}", run, total_values))
            )

    progress(f"pipeline, {cores_label}: {len(cases) + 1} cases, >= {cfg.rounds} rounds")
    time_round_robin(
        [fused] + [c[2] for c in cases], cfg.rounds, min_clean=cfg.min_clean, budget_s=cfg.budget_s
    )

    rows = []
    for batch_size, kind, timed in cases:
        ratio = timed.rate / fused.rate
        what = {
            "in_graph": "StatelessRngDataset consumed in a tf.function",
            "stateless": "StatelessRngDataset, Python loop",
            "serial": "StatelessRngDataset consumed in a tf.function, serial map",
            "stateful": "conventional stateful-RNG map",
        }[kind]
        row = Row(
            section="pipeline",
            benchmark="input pipeline vs fused op",
            configuration=f"{what}, B={batch_size}, {cores_label}",
            unit="values/s",
            measured=timed.rate,
            baseline=fused.rate,
            ratio=ratio,
            noisy=noisy(timed, fused, min_clean=cfg.min_clean),
            params={"pipeline": kind, "batch": batch_size, "cores": cores},
        )
        rows.append(row)
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cores", choices=("1", "all"), default="all")
    parser.add_argument("--quick", action="store_true", help="tiny sizes: a smoke run")
    parser.add_argument("--out", type=Path, required=True, help="write the rows here (JSON)")
    args = parser.parse_args(argv)
    if args.cores == "1":
        pin_to_one_cpu()
        label = "1 core"
    else:
        label = f"{len(os.sched_getaffinity(0))} cores"
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    rows = measure(QUICK if args.quick else FULL, cores_label=label)
    write_json(args.out, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
