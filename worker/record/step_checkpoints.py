"""What a mid-epoch (step) checkpoint adds to an epoch checkpoint, and resuming from one.

The data is stateless, so the input pipeline's state is just (epoch, next batch): a
resumed epoch is generated from its next batch on, nothing replayed. What else moves
during an epoch travels in the checkpoint's meta: the process-global RNG states and the
running training metrics, so a resumed epoch reports what an uninterrupted one would.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from worker.data.stateless_dataset import StatelessRngDataset
from worker.errors import CheckpointError
from worker.record.checkpoint import Syncer, save_checkpoint, step_stem
from worker.record.fingerprint import fingerprint_arrays
from worker.record.trace import TracePoint
from worker.record.variable_reads import read_state
from worker.training import determinism


def epoch_dataset(data: StatelessRngDataset, epoch: int, first_batch: int) -> tf.data.Dataset:
    """Epoch `epoch`'s batches from `first_batch` on, generated as the whole epoch would be."""
    epoch_data = data.for_epoch(epoch)
    if first_batch == 0:
        return epoch_data.as_dataset()
    # The same pipeline over a shorter range of batch ids: batch b's values depend on
    # (seed, epoch, b) only, so the remaining batches equal the uninterrupted epoch's.
    remaining = epoch_data.num_batches - first_batch
    ds = tf.data.Dataset.range(first_batch, epoch_data.num_batches, name="batch_ids")
    parallel = epoch_data.num_parallel_calls
    ds = ds.map(
        epoch_data.make_batch,
        num_parallel_calls=parallel,
        deterministic=epoch_data.deterministic_order if parallel else None,
        name="generate",
    )
    ds = ds.apply(tf.data.experimental.assert_cardinality(remaining))
    if epoch_data.prefetch_buffer:
        ds = ds.prefetch(epoch_data.prefetch_buffer)
    return ds


def metric_state(metrics: Sequence[keras.metrics.Metric]) -> dict[str, list[Any]]:
    """The running metrics' variables as JSON-safe lists (float32 is exact in JSON's float64)."""
    values = {m.name: [np.asarray(v.numpy()) for v in m.variables] for m in metrics}
    return {
        name: [{"dtype": value.dtype.name, "value": value.tolist()} for value in read]
        for name, read in values.items()
    }


def restore_metric_state(
    metrics: Sequence[keras.metrics.Metric], state: dict[str, list[Any]]
) -> None:
    """Put back what `metric_state` recorded."""
    for metric in metrics:
        saved = state.get(metric.name)
        if saved is None or len(saved) != len(metric.variables):
            raise CheckpointError(f"the checkpoint has no state for metric {metric.name!r}")
        for variable, entry in zip(metric.variables, saved, strict=True):
            variable.assign(np.asarray(entry["value"], dtype=entry["dtype"]))


def step_meta(
    epoch: int, batch: int, step: int, train_metrics: Sequence[keras.metrics.Metric]
) -> dict[str, Any]:
    """The meta keys a step checkpoint has beyond an epoch checkpoint's."""
    return {
        "epoch": epoch,
        "batch": batch,
        "step": step,
        "rng": determinism.rng_state(),
        "metric_state": metric_state(train_metrics),
    }


def save_step_checkpoint(
    directory: Path,
    *,
    state: Sequence[tuple[str, Any]],
    meta: Callable[[str, str], dict[str, Any]],
    last_point: TracePoint,
    position: tuple[int, int, int],
    train_metrics: Sequence[keras.metrics.Metric],
    syncer: Syncer | None = None,
) -> str:
    """Write the step checkpoint at (epoch, batch, global step); returns its JSON's name.

    `meta(name, fingerprint)` gives the keys every checkpoint has. The variables are read
    once for both the arrays and the fingerprint, which is reused instead from a trace
    point taken at this very step.
    """
    epoch, batch, step = position
    arrays = read_state(state)
    fingerprint = (
        last_point.fingerprint
        if (last_point.kind, last_point.step) == ("step", step)
        else fingerprint_arrays(zip((path for path, _ in state), arrays, strict=True)).fingerprint
    )
    name = f"{step_stem(step)}.json"
    full = {**meta(name, fingerprint), **step_meta(epoch, batch, step, train_metrics)}
    save_checkpoint(
        directory,
        epoch=epoch,
        step=step,
        batch=batch,
        state=state,
        meta=full,
        arrays=arrays,
        syncer=syncer,
    )
    return name


def resume_within_epoch(
    meta: dict[str, Any], train_metrics: Sequence[keras.metrics.Metric]
) -> None:
    """After the epoch's reseed: restore the RNG states and running metrics of a step checkpoint."""
    determinism.restore_rng_state(meta["rng"])
    restore_metric_state(train_metrics, meta["metric_state"])
