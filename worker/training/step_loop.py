"""An epoch's optimizer steps, run one per compiled call or several per call.

Several steps per call is the idea behind Keras's `steps_per_execution`: the compiled
function takes the dataset iterator and runs k steps inside the graph, so the Python
cost of a call (dispatch, one iterator `next`) is paid once per k steps. A call never
crosses a boundary the loop must stop at (a trace point, a step checkpoint, the epoch's
end), so every fingerprint is taken exactly where one step per call takes it, from the
same values: the same step function runs the same ops on the same batches.

The k steps are unrolled, not a `tf.while_loop`: TensorFlow rewrites a loop body's graph
differently from a top-level step's (oneDNN fusions among them), which changed the bits
of a transformer's training. Every call runs the same k (a divisor of the distance
between boundaries), so a job traces one multi-step function: each epoch's reseed
(`tf.random.set_seed`) clears TensorFlow's instantiated functions, and every further
variant would be optimised again in every epoch.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import tensorflow as tf

from worker.errors import GeneratorError
from worker.record.fingerprint import StreamDigest

MAX_STEPS_PER_CALL = 16


def call_size(periods: list[int | None], cap: int = MAX_STEPS_PER_CALL) -> int:
    """The steps per call: the largest divisor, at most `cap`, of every boundary period.

    Boundaries (trace points, step checkpoints, epoch ends) fall on multiples of their
    periods' greatest common divisor, so calls of that many steps never cross one.
    """
    period = math.gcd(*[p for p in periods if p])
    return max(d for d in range(1, min(cap, period) + 1) if period % d == 0)


def xy(batch: Any, generator: str) -> tuple[Any, Any]:
    """The (x, y) of one generated batch."""
    if isinstance(batch, dict) and "x" in batch and "y" in batch:
        return batch["x"], batch["y"]
    if isinstance(batch, tuple | list) and len(batch) == 2:
        return batch[0], batch[1]
    raise GeneratorError(generator, "must return (x, y) or a mapping with keys 'x' and 'y'")


def batches(dataset: tf.data.Dataset, generator: str) -> Iterator[tuple[Any, Any]]:
    """The dataset's (x, y) pairs; a failure inside the generator names the generator."""
    iterator = iter(dataset)
    while True:
        try:
            batch = next(iterator)
        except StopIteration:
            return
        except tf.errors.OpError as exc:
            raise GeneratorError(
                generator, f"failed while generating a batch: {exc.message}"
            ) from exc
        yield xy(batch, generator)


def next_xy(iterator: Any, generator: str) -> tuple[Any, Any]:
    """The next (x, y) of a batch iterator that must have one."""
    try:
        batch = next(iterator)
    except StopIteration:
        raise GeneratorError(generator, "ran out of batches before the epoch's end") from None
    except tf.errors.OpError as exc:
        raise GeneratorError(generator, f"failed while generating a batch: {exc.message}") from exc
    return xy(batch, generator)


class MultiStep:
    """A compiled function running k steps of `step_fn` on batches from an iterator."""

    def __init__(self, step_fn: Callable[[Any, Any], Any], generator: str) -> None:
        self.generator = generator
        self._step_fn = step_fn
        self.function = tf.function(self._steps, reduce_retracing=True)

    def _steps(self, iterator: Any, k: int) -> Any:
        loss = None
        for _ in range(k):
            x, y = xy(iterator.get_next(), self.generator)
            loss = self._step_fn(x, y)
        return loss

    def __call__(self, iterator: Any, k: int) -> Any:
        try:
            return self.function(iterator, k)
        except tf.errors.OpError as exc:
            if "IteratorGetNext" in str(exc):
                raise GeneratorError(
                    self.generator, f"failed while generating a batch: {exc.message}"
                ) from exc
            raise


def epoch_steps(
    *,
    iterator: Any,
    generator: str,
    single: Callable[[Any, Any], Any],
    multi: MultiStep | None,
    first_batch: int,
    num_batches: int,
    step: int,
    steps_to_boundary: Callable[[int], int],
    steps_per_call: int,
    digest: StreamDigest | None,
) -> Iterator[tuple[int, int, Any]]:
    """Train an epoch from `first_batch`; yields (batches done, global step, loss) per call.

    `iterator` gives the epoch's batches from `first_batch` on (it may go on into the next
    epochs': exactly `num_batches - first_batch` are taken). `multi` None (or
    `steps_per_call` 1) runs one step per call, feeding `digest` the batches when there is
    one. Otherwise each call runs `steps_per_call` steps, or single steps where fewer
    remain before the next boundary (`steps_to_boundary(step)`).
    """
    if multi is None or steps_per_call == 1:
        for batch in range(first_batch + 1, num_batches + 1):
            x, y = next_xy(iterator, generator)
            if digest is not None:
                digest.add_array(f"{batch - 1}/0", np.asarray(x))
                digest.add_array(f"{batch - 1}/1", np.asarray(y))
            loss = single(x, y)
            step += 1
            yield batch, step, loss
        return
    batch = first_batch
    while batch < num_batches:
        left = min(num_batches - batch, steps_to_boundary(step))
        k = steps_per_call if left >= steps_per_call else 1
        loss = multi(iterator, k)
        batch, step = batch + k, step + k
        yield batch, step, loss
