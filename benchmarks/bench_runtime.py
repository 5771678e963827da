"""Throughput of the training runtime's hot paths, each as a ratio to a baseline.

1. Dataset generation: StatelessRngDataset iterated to the end, against the ceiling of
   one fused stateless op producing the same number of values of the same dtypes.
2. Fingerprinting: `fingerprint_state(training_state(model, optimizer))`, against hashing
   the same bytes, already in memory as NumPy arrays, with the same hash settings.

Both sides of a ratio are measured in the same process, interleaved round by round, and
each keeps its best round: on a shared machine noise only ever adds time, so the minimum
is the most repeatable estimate of what the code itself costs. The script reports; it
exits 0 whether or not a target is met.

    .venv/bin/python benchmarks/bench_runtime.py
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from functools import partial
from typing import Any

# TensorFlow reads this at import time; its start-up chatter would bury the table.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import blake3
import keras
import numpy as np
import tensorflow as tf

from worker.fingerprint import (
    DEFAULT_ALGORITHM,
    fingerprint_arrays,
    fingerprint_state,
    new_hash,
    training_state,
)
from worker.stateless_dataset import AUTOTUNE, StatelessRngDataset

DATASET_TARGET = 0.9
FINGERPRINT_TARGET = 0.8
NUM_CLASSES = 10
SEED = (20240611, 7)


@dataclass(frozen=True)
class Config:
    """Sizes of one run; `--quick` swaps in a smoke-test configuration."""

    features: int
    total_rows: int
    batch_sizes: tuple[int, ...]
    mlp_width: int
    mlp_depth: int
    rounds: int  # timed rounds at least, after one warm-up round
    min_clean: int  # then more, up to the budget, until each case has this many clean ones
    dataset_budget_s: float
    fingerprint_budget_s: float


FULL = Config(
    features=256,
    total_rows=1 << 18,  # 67.4 M values per pass: ~0.5 s, long enough to time stably
    batch_sizes=(256, 1024, 4096),
    mlp_width=4096,
    mlp_depth=4,  # 268.5 MB of weights, 805 MB with Adam's two moments
    rounds=11,
    min_clean=3,
    dataset_budget_s=150,  # a round takes ~6 s
    fingerprint_budget_s=40,  # a round takes ~0.5 s
)
QUICK = Config(
    features=32,
    total_rows=1 << 13,
    batch_sizes=(256, 1024),
    mlp_width=256,
    mlp_depth=2,
    rounds=2,
    min_clean=0,
    dataset_budget_s=0,
    fingerprint_budget_s=0,
)


_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds() -> tuple[float, float]:
    """(CPU seconds the machine spent busy or stolen by the host, CPU seconds of this process).

    The first is NaN where /proc/stat is missing; then no round can be judged clean.
    """
    own = os.times()
    try:
        with open("/proc/stat", encoding="ascii") as f:
            ticks = [int(v) for v in f.readline().split()[1:9]]
    except OSError:
        return math.nan, own.user + own.system
    # user nice system idle iowait irq softirq steal: all but idle and iowait is CPU in use.
    busy = sum(ticks) - ticks[3] - ticks[4]
    return busy / _CLOCK_TICKS, own.user + own.system


@dataclass
class Timed:
    """One side of a comparison: a callable returning the work it did, and its timings."""

    name: str
    run: Callable[[], int]
    work: int  # values or bytes a run must report, so no side can silently do less
    seconds: list[float] = field(default_factory=list)
    clean: list[bool] = field(default_factory=list)  # no other process took CPU meanwhile

    @property
    def pool(self) -> list[float]:
        """Clean rounds if there are any: a round that shared the CPU measures the neighbours."""
        clean = [t for t, ok in zip(self.seconds, self.clean, strict=True) if ok]
        return clean or self.seconds

    @property
    def clean_rounds(self) -> int:
        return sum(self.clean)

    @property
    def best(self) -> float:
        return min(self.pool)

    @property
    def median(self) -> float:
        return statistics.median(self.pool)


def time_once(case: Timed) -> tuple[float, bool]:
    """Seconds of one run, and whether other processes left the CPU to it meanwhile."""
    busy0, own0 = cpu_seconds()
    start = time.perf_counter()
    done = case.run()
    elapsed = time.perf_counter() - start
    busy1, own1 = cpu_seconds()
    if done != case.work:
        raise RuntimeError(f"{case.name}: did {done} units of work, expected {case.work}")
    others = (busy1 - busy0) - (own1 - own0)
    # Tick counters are coarse (10 ms): allow two ticks, and 5% of a core for the kernel.
    return elapsed, others <= 0.05 * elapsed + 2 / _CLOCK_TICKS


def time_round_robin(
    cases: Sequence[Timed], rounds: int, *, min_clean: int, budget_s: float, warmup: int = 1
) -> None:
    """Run every case once per round, alternating the order so no case always goes first.

    After `rounds` rounds, keep going until every case has `min_clean` clean rounds or
    `budget_s` seconds have passed: other jobs on a shared machine come and go.
    """
    deadline = time.monotonic() + budget_s
    r = 0
    while True:
        order = list(cases) if r % 2 == 0 else list(reversed(cases))
        for case in order:
            elapsed, clean = time_once(case)
            if r >= warmup:
                case.seconds.append(elapsed)
                case.clean.append(clean)
        r += 1
        if r - warmup < rounds:
            continue
        if all(c.clean_rounds >= min_clean for c in cases) or time.monotonic() > deadline:
            return


@dataclass
class Row:
    benchmark: str
    configuration: str
    unit: str
    work: int
    measured: float  # work per second, best round
    baseline: float
    ratio: float
    target: float | None  # None: shown for information
    met: bool | None
    measured_median: float
    baseline_median: float
    rounds: int  # timed rounds per side
    measured_clean_rounds: int  # of which no other process took CPU; best is over these
    baseline_clean_rounds: int
    clean: bool  # both sides had enough clean rounds; else the figures are noisy


def make_row(
    benchmark: str,
    configuration: str,
    unit: str,
    measured: Timed,
    baseline: Timed,
    target: float | None,
    min_clean: int,
) -> Row:
    if measured.work != baseline.work:
        raise RuntimeError(f"{configuration}: the two sides do different amounts of work")
    ratio = baseline.best / measured.best
    return Row(
        benchmark=benchmark,
        configuration=configuration,
        unit=unit,
        work=measured.work,
        measured=measured.work / measured.best,
        baseline=baseline.work / baseline.best,
        ratio=ratio,
        target=target,
        met=None if target is None else ratio >= target,
        measured_median=measured.work / measured.median,
        baseline_median=baseline.work / baseline.median,
        rounds=len(measured.seconds),
        measured_clean_rounds=measured.clean_rounds,
        baseline_clean_rounds=baseline.clean_rounds,
        clean=min(measured.clean_rounds, baseline.clean_rounds) >= max(min_clean, 1),
    )


# --- 1. dataset generation -------------------------------------------------------------


def blobs_generator(features: int) -> Callable[[tf.Tensor, tf.Tensor], tuple[tf.Tensor, tf.Tensor]]:
    """A minimal stateless generator: normal features and uniform integer labels."""

    def blobs_batch(indices: tf.Tensor, seed: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        n = tf.shape(indices)[0]
        s_x, s_y = tf.unstack(tf.random.experimental.stateless_split(seed, 2))
        x = tf.random.stateless_normal([n, features], seed=s_x)
        y = tf.random.stateless_uniform([n], seed=s_y, minval=0, maxval=NUM_CLASSES, dtype=tf.int32)
        return x, y

    return blobs_batch


def fused_values(total_rows: int, features: int) -> tuple[tf.Tensor, tf.Tensor]:
    """Every value of a whole pass from one op per output: the ceiling for generation."""
    s_x, s_y = tf.unstack(tf.random.experimental.stateless_split(tf.constant(SEED, tf.int64), 2))
    x = tf.random.stateless_normal([total_rows, features], seed=s_x)
    y = tf.random.stateless_uniform(
        [total_rows], seed=s_y, minval=0, maxval=NUM_CLASSES, dtype=tf.int32
    )
    return x, y


def consume(ds: tf.data.Dataset) -> int:
    """Iterate to the end in Python; each element arrives computed, and its values are counted."""
    values = 0
    for x, y in ds:
        values += x.shape.num_elements() + y.shape.num_elements()
    return values


def in_graph_consumer(ds: tf.data.Dataset) -> Callable[[], int]:
    """The same full iteration inside a tf.function: no Python work per element.

    Shown for information: the gap between this and `consume` is what Python's iterator
    costs per element, which no dataset implementation can remove.
    """

    def count_values() -> tf.Tensor:
        values = tf.constant(0, tf.int64)
        for x, y in ds:
            values += tf.size(x, out_type=tf.int64) + tf.size(y, out_type=tf.int64)
        return values

    compiled: Callable[[], tf.Tensor] = tf.function(count_values)
    return lambda: int(compiled())


@dataclass(frozen=True)
class DatasetCase:
    timed: Timed
    target: float | None


def bench_dataset(cfg: Config) -> list[Row]:
    total_values = cfg.total_rows * (cfg.features + 1)

    def run_fused() -> int:
        x, y = fused_values(cfg.total_rows, cfg.features)
        # np.asarray views a CPU tensor without copying: it waits for the op, adds nothing.
        return np.asarray(x).size + np.asarray(y).size

    fused = Timed("fused op", run_fused, total_values)
    x_ref, y_ref = fused_values(cfg.total_rows, cfg.features)
    expected_dtypes = (x_ref.dtype, y_ref.dtype)
    del x_ref, y_ref

    cases: list[DatasetCase] = []
    for batch_size in cfg.batch_sizes:
        if cfg.total_rows % batch_size:
            raise ValueError(f"total_rows {cfg.total_rows} is not a multiple of {batch_size}")
        for parallel, label in ((AUTOTUNE, "AUTOTUNE"), (1, "1")):
            data = StatelessRngDataset(
                blobs_generator(cfg.features),
                batch_size=batch_size,
                num_batches=cfg.total_rows // batch_size,
                base_seed=SEED,
                num_parallel_calls=parallel,
                prefetch_buffer=AUTOTUNE,
            )
            ds = data.as_dataset()
            if tuple(spec.dtype for spec in ds.element_spec) != expected_dtypes:
                raise RuntimeError("dataset and fused op produce different dtypes")
            name = f"batch={batch_size}, num_parallel_calls={label}"
            python_loop = Timed(f"{name}, Python loop", partial(consume, ds), total_values)
            if parallel != AUTOTUNE:
                cases.append(DatasetCase(python_loop, None))
                continue
            cases.append(DatasetCase(python_loop, DATASET_TARGET))
            in_graph = Timed(f"{name}, tf.function loop", in_graph_consumer(ds), total_values)
            cases.append(DatasetCase(in_graph, None))

    time_round_robin(
        [fused] + [case.timed for case in cases],
        cfg.rounds,
        min_clean=cfg.min_clean,
        budget_s=cfg.dataset_budget_s,
    )
    return [
        make_row(
            "dataset generation",
            case.timed.name,
            "values/s",
            case.timed,
            fused,
            case.target,
            cfg.min_clean,
        )
        for case in cases
    ]


# --- 2. fingerprinting -------------------------------------------------------------------


def build_state(cfg: Config) -> tuple[list[tuple[str, Any]], str]:
    """An MLP and a built Adam optimizer: the state a training job fingerprints."""
    keras.utils.set_random_seed(0)
    inputs = keras.Input((cfg.mlp_width,))
    x = inputs
    for _ in range(cfg.mlp_depth):
        x = keras.layers.Dense(cfg.mlp_width)(x)
    model = keras.Model(inputs, x)
    optimizer = keras.optimizers.Adam()
    optimizer.build(model.trainable_variables)
    state = training_state(model, optimizer)
    model_bytes = sum(int(np.prod(v.shape)) * np.dtype(v.dtype).itemsize for v in model.variables)
    label = (
        f"MLP {cfg.mlp_width}->Dense({cfg.mlp_width})x{cfg.mlp_depth} "
        f"({model_bytes / 1e6:.1f} MB) + Adam"
    )
    return state, label


def hash_arrays(arrays: Sequence[np.ndarray]) -> int:
    """Raw hashing: each array's bytes through the hash fingerprint.py picks for its size."""
    for array in arrays:
        h = new_hash(DEFAULT_ALGORITHM, size_hint=array.nbytes)
        h.update(array.reshape(-1).view(np.uint8))
        h.digest()
    return sum(a.nbytes for a in arrays)


def bench_fingerprint(cfg: Config) -> list[Row]:
    state, label = build_state(cfg)
    # `.numpy()` copies: the baseline hashes NumPy-owned memory holding the same bytes.
    arrays: list[np.ndarray] = [v.numpy() for _, v in state]
    total_bytes = int(sum(a.nbytes for a in arrays))
    expected = fingerprint_arrays((p, a) for (p, _), a in zip(state, arrays, strict=True))
    if fingerprint_state(state) != expected:
        raise RuntimeError("fingerprint_state did not hash the bytes of the baseline")

    def run_fingerprint() -> int:
        fingerprint_state(state)
        return total_bytes

    def run_via_numpy() -> int:
        # The pre-optimisation read path (`.numpy()` copies), kept to show what it cost.
        fingerprint_arrays((path, v.numpy()) for path, v in state)
        return total_bytes

    measured = Timed("fingerprint_state", run_fingerprint, total_bytes)
    via_numpy = Timed("fingerprint via .numpy()", run_via_numpy, total_bytes)
    baseline = Timed("raw hash", lambda: hash_arrays(arrays), total_bytes)
    time_round_robin(
        [baseline, measured, via_numpy],
        cfg.rounds,
        min_clean=cfg.min_clean,
        budget_s=cfg.fingerprint_budget_s,
    )
    return [
        make_row(
            "fingerprinting",
            f"fingerprint_state, {label}",
            "bytes/s",
            measured,
            baseline,
            FINGERPRINT_TARGET,
            cfg.min_clean,
        ),
        make_row(
            "fingerprinting",
            "same state, read with .numpy() (copies)",
            "bytes/s",
            via_numpy,
            baseline,
            None,
            cfg.min_clean,
        ),
    ]


# --- report ------------------------------------------------------------------------------


def environment() -> dict[str, Any]:
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return {
        "cores": os.cpu_count(),
        "memory_gib": round(memory / 2**30, 1),
        "machine": platform.machine(),
        "python": platform.python_version(),
        "tensorflow": tf.__version__,
        "keras": keras.__version__,
        "blake3": blake3.__version__,
        "numpy": np.__version__,
        "loadavg_start": os.getloadavg(),
    }


def fmt_rate(value: float, unit: str) -> str:
    if unit == "bytes/s":
        return f"{value / 1e9:.2f} GB/s"
    return f"{value / 1e6:.1f} Mvalues/s"


def render_table(rows: Sequence[Row]) -> str:
    header = ["benchmark", "configuration", "measured", "baseline", "ratio", "target", "met"]
    body = [
        [
            r.benchmark,
            r.configuration,
            fmt_rate(r.measured, r.unit),
            fmt_rate(r.baseline, r.unit),
            f"{r.ratio:.2f}" + ("" if r.clean else "*"),
            "-" if r.target is None else f">= {r.target:.2f}",
            "(info)" if r.met is None else ("yes" if r.met else "no"),
        ]
        for r in rows
    ]
    widths = [max(len(line[i]) for line in [header, *body]) for i in range(len(header))]

    def line(cells: Sequence[str]) -> str:
        return "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)) + " |"

    rule = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    table = [line(header), rule, *(line(cells) for cells in body)]
    if not all(r.clean for r in rows):
        table.append(
            "* too few rounds of this row had the CPU to themselves (other processes were "
            "busy): its figures include their interference; rerun on an idle machine"
        )
    return "\n".join(table)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes: a smoke run")
    parser.add_argument("--json", metavar="PATH", help="also write the rows as JSON here")
    parser.add_argument("--only", choices=("dataset", "fingerprint"), help="run one benchmark only")
    parser.add_argument(
        "--rounds", type=int, help=f"timed rounds at least (default: {FULL.rounds})"
    )
    args = parser.parse_args(argv)

    cfg = QUICK if args.quick else FULL
    if args.rounds is not None:
        cfg = replace(cfg, rounds=args.rounds)
    env = environment()
    started = time.perf_counter()
    rows: list[Row] = []
    if args.only in (None, "dataset"):
        rows += bench_dataset(cfg)
    if args.only in (None, "fingerprint"):
        rows += bench_fingerprint(cfg)
    env["loadavg_end"] = os.getloadavg()
    env["seconds"] = round(time.perf_counter() - started, 1)

    print(
        f"{env['cores']} cores, {env['memory_gib']} GiB, TensorFlow {env['tensorflow']}, "
        f"Keras {env['keras']}, blake3 {env['blake3']}; best of >= {cfg.rounds} rounds "
        f"(clean ones where possible); load average "
        f"{env['loadavg_start'][0]:.2f} -> {env['loadavg_end'][0]:.2f}; {env['seconds']} s"
    )
    if args.quick:
        print("--quick: a smoke run; at these sizes fixed costs dominate and ratios mean nothing")
    print(render_table(rows))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"environment": env, "rows": [asdict(r) for r in rows]}, f, indent=2)
            f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
