"""An epoch's optimizer steps, run one per compiled call or several per call.

Several steps per call (`training.steps_per_execution` N > 1) is Keras's
`steps_per_execution`: the compiled function takes the dataset iterator and runs k steps
in a `tf.while_loop`, so the Python cost of a call (dispatch, one iterator `next`) is paid
once per k steps. A call never crosses a boundary the loop must stop at (a trace point, a
step checkpoint, the epoch's end), so every fingerprint is taken where one step per call
takes it.

The loop body calls the job's compiled one-step function, as Keras's loop calls its own:
inlining the step's ops into the body instead made the loop compile several times slower.
k is a tensor: one traced function serves every call, so each epoch's reseed (which clears
TensorFlow's instantiated functions) re-optimises one function, and every step of a job
runs the same loop body whatever k its call has. That is what keeps the bits independent of
where calls are cut (a resume, `--trace-every-steps`). Against N = 1 they may differ, since
TensorFlow may rewrite a loop body's graph differently from a top-level step's (an unrolled
loop once changed a transformer's bits), so the spec hash includes N.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import tensorflow as tf

from worker.errors import GeneratorError
from worker.record.fingerprint import StreamDigest


def xy(batch: Any, generator: str) -> tuple[Any, Any]:
    """The (x, y) of one generated batch."""
    if isinstance(batch, dict) and "x" in batch and "y" in batch:
        return batch["x"], batch["y"]
    if isinstance(batch, tuple | list) and len(batch) == 2:
        return batch[0], batch[1]
    raise GeneratorError(generator, "must return (x, y) or a mapping with keys 'x' and 'y'")


def is_xy_pair(element_spec: Any) -> bool:
    """Whether a batch is exactly two tensors, x then y: then what a step consumes is every
    value of the batch, in the order its data fingerprint digests them."""
    if isinstance(element_spec, dict):
        if set(element_spec) != {"x", "y"}:
            return False
        element_spec = (element_spec["x"], element_spec["y"])
    return (
        isinstance(element_spec, tuple | list)
        and len(element_spec) == 2
        and all(isinstance(leaf, tf.TensorSpec) for leaf in element_spec)
    )


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


class LoopedSteps:
    """A compiled function running k steps of the compiled `step_fn` on batches from an
    iterator; with `keep_batches`, it also returns the k (x, y) it consumed, stacked, so
    their data fingerprint is taken as consumed rather than by generating them again."""

    def __init__(
        self, step_fn: Callable[[Any, Any], Any], generator: str, *, keep_batches: bool = False
    ) -> None:
        self.generator = generator
        self.keep_batches = keep_batches
        self._step_fn = step_fn
        self.function = tf.function(self._steps)

    def _steps(self, iterator: Any, k: tf.Tensor) -> Any:
        x_spec, y_spec = xy(iterator.element_spec, self.generator)
        kept = (
            (
                tf.TensorArray(x_spec.dtype, size=k, element_shape=x_spec.shape),
                tf.TensorArray(y_spec.dtype, size=k, element_shape=y_spec.shape),
            )
            if self.keep_batches
            else ()
        )

        def body(i: tf.Tensor, _: tf.Tensor, *kept: Any) -> tuple[Any, ...]:
            x, y = xy(iterator.get_next(), self.generator)
            # The loss only reports progress; a float32 scalar whatever the model's dtype.
            loss = tf.reduce_mean(tf.cast(self._step_fn(x, y), tf.float32))
            if kept:
                kept = (kept[0].write(i, x), kept[1].write(i, y))
            return (i + 1, loss, *kept)

        start = (tf.constant(0, tf.int32), tf.constant(0.0, tf.float32), *kept)
        _, loss, *ended = tf.while_loop(lambda i, *_: i < k, body, start)
        return (loss, ended[0].stack(), ended[1].stack()) if ended else loss

    def __call__(self, iterator: Any, k: int) -> Any:
        """The loss of the last step (and, with `keep_batches`, the stacked xs and ys)."""
        try:
            return self.function(iterator, tf.constant(k, tf.int32))
        except tf.errors.OpError as exc:
            if "IteratorGetNext" in str(exc) or isinstance(exc, tf.errors.OutOfRangeError):
                raise GeneratorError(
                    self.generator, f"failed while generating a batch: {exc.message}"
                ) from exc
            raise


def epoch_steps(
    *,
    iterator: Any,
    generator: str,
    single: Callable[[Any, Any], Any],
    looped: LoopedSteps | None,
    first_batch: int,
    num_batches: int,
    step: int,
    steps_to_boundary: Callable[[int], int],
    steps_per_call: int,
    digest: StreamDigest | None,
) -> Iterator[tuple[int, int, Any]]:
    """Train an epoch from `first_batch`; yields (batches done, global step, loss) per call.

    `iterator` gives the epoch's batches from `first_batch` on (it may go on into the next
    epochs': exactly `num_batches - first_batch` are taken). `looped` None runs one step per
    call of `single`. Otherwise every call goes through `looped`: `steps_per_call` steps, or
    fewer where the next boundary (`steps_to_boundary(step)`) or the epoch's end comes
    first. Either way `digest`, when there is one, is fed the batches as they are consumed
    (`looped` must then keep its batches).
    """
    if looped is None:
        for batch in range(first_batch + 1, num_batches + 1):
            x, y = next_xy(iterator, generator)
            if digest is not None:
                digest.add_batch(batch - 1, (x, y))
            loss = single(x, y)
            step += 1
            yield batch, step, loss
        return
    batch = first_batch
    while batch < num_batches:
        k = min(num_batches - batch, steps_to_boundary(step), steps_per_call)
        loss = looped(iterator, k)
        if looped.keep_batches:
            loss, xs, ys = loss
            if digest is not None:
                xs, ys = np.asarray(xs), np.asarray(ys)
                for j in range(k):
                    digest.add_batch(batch + j, (xs[j], ys[j]))
        batch, step = batch + k, step + k
        yield batch, step, loss
