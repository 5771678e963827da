"""The data a script trains on, digested batch by batch as the training consumes it.

`run.dataset(ds)` returns `ds` with one more step, which fingerprints each element (a batch)
inside the input pipeline, as it is made (TensorFlow's `tf.fingerprint`, FarmHash64 over
each leaf's bytes, then over those), and writes the fingerprint into a ring of slots the
run reads at its trace points. Nothing of it runs in Python per batch: a Python callback in
the pipeline cost a small model a fifth of its steps. Trace points take the fingerprints
one batch per optimizer step: an epoch's data fingerprint is the digest of the batches of
its steps, in order. Counting by steps, not by what was made, keeps batches a prefetch has
made ahead of time out of the epoch before, so two runs split their batches into epochs
the same way. Arrays given to `model.fit` whole (under `reprotrain.autolog()`) are
digested once, as they are: their order within an epoch is Keras's shuffle, seeded by the
run.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from typing import Any

import numpy as np

from worker.record.fingerprint import DEFAULT_ALGORITHM, StreamDigest, new_hash

_TAPPED = "_reprotrain_tapped"
# Batches the pipeline may make between two trace points before the oldest unread
# fingerprints are overwritten (8 bytes each: 8 MiB).
RING_SLOTS = 1 << 20


class _Ring:
    """Fingerprint slots the pipeline writes in order and the run reads at trace points."""

    def __init__(self) -> None:
        import tensorflow as tf

        with tf.init_scope():
            self.slots = tf.Variable(tf.zeros([RING_SLOTS, 8], tf.uint8), trainable=False)
            self.written = tf.Variable(0, dtype=tf.int64, trainable=False)
        self.read = 0

    def write(self, fingerprint: Any) -> Any:
        """In the pipeline: the slot first, then the count, so a counted slot is filled."""
        import tensorflow as tf

        at = self.written.read_value()
        stored = self.slots.scatter_nd_update([[at % RING_SLOTS]], fingerprint)
        with tf.control_dependencies([stored]):
            return self.written.assign_add(1, read_value=False)

    def take(self) -> tuple[list[str], int]:
        """(The fingerprints written since the last take, in order; how many were lost)."""
        import tensorflow as tf

        written = int(self.written.numpy())
        lost = max(0, written - self.read - RING_SLOTS)
        first = self.read + lost
        self.read = written
        if written == first:
            return [], lost
        rows = tf.gather(self.slots, tf.range(first, written, dtype=tf.int64) % RING_SLOTS)
        return [bytes(row).hex() for row in rows.numpy()], lost


class ConsumedData:
    """Per-batch fingerprints as made, taken into per-epoch data fingerprints by step."""

    def __init__(self, algorithm: str = DEFAULT_ALGORITHM) -> None:
        self.algorithm = algorithm
        self._batches: deque[str | None] = deque()  # read from the ring, not yet taken
        self._accounted = 0  # the steps whose batches are taken
        self._epoch = new_hash(algorithm)
        self._epoch_batches = 0
        self._missing = 0  # steps of this epoch no digest was there for
        self._lost = 0  # fingerprints overwritten before a trace point read them
        self.whole: str | None = None  # arrays given to fit whole: their digest
        self.ring: _Ring | None = None  # made with the first dataset wrapped

    def add_batch(self, leaves: Iterable[Any]) -> None:
        """One batch, as produced (its leaves as arrays)."""
        digest = StreamDigest(self.algorithm)
        digest.add_batch(0, leaves)
        self._batches.append(digest.hexdigest())

    def add_whole(self, leaves: Iterable[Any]) -> None:
        """The arrays `fit` was given whole: the data of each epoch it trains."""
        digest = StreamDigest(self.algorithm)
        digest.add_batch(0, (np.asarray(leaf) for leaf in leaves))
        self.whole = "arrays:" + digest.hexdigest()

    def resume_at(self, step: int) -> None:
        """A resumed run: the batches of steps up to `step` were taken by the run it
        continues."""
        self._accounted = step

    def _pull(self) -> None:
        if self.ring is None:
            return
        fingerprints, lost = self.ring.take()
        self._lost += lost
        self._batches.extend([None] * lost)  # their steps still count, as missing
        self._batches.extend(fingerprints)

    def advance(self, step: int) -> None:
        """Take one batch for each step since the last trace point, up to `step`."""
        self._pull()
        for _ in range(step - self._accounted):
            batch = self._batches.popleft() if self._batches else None
            if batch is None:
                self._missing += 1
                continue
            line = f"{self._epoch_batches}:{batch}\n"
            self._epoch.update(line.encode())
            self._epoch_batches += 1
        self._accounted = max(self._accounted, step)

    def end_epoch(self, epoch: int, step: int) -> tuple[str | None, str | None]:
        """(The epoch's data fingerprint, or None; what to warn of, or None)."""
        self.advance(step)
        taken, missing, lost = self._epoch_batches, self._missing, self._lost
        fingerprint = f"{self.algorithm}:{self._epoch.digest().hex()}"
        self._epoch = new_hash(self.algorithm)
        self._epoch_batches = self._missing = self._lost = 0
        if lost:
            return None, (
                f"the input pipeline made more than {RING_SLOTS} batches between two trace "
                f"points before the end of epoch {epoch}: its data fingerprint is left out "
                "(trace more often: run.keras_callback(every_steps=N))"
            )
        if taken and not missing:
            return fingerprint, None
        if not taken:
            return self.whole, None  # no wrapped data trained on: the arrays, if any
        return None, (
            f"epoch {epoch} trained {taken + missing} steps but run.dataset() saw {taken} "
            "batches: its data fingerprint is left out (wrap all the data the steps train "
            "on, and only that, with run.dataset())"
        )


def tap(dataset: Any, data: ConsumedData) -> Any:
    """`dataset`, each element fingerprinted into `data`'s ring as it is made."""
    import tensorflow as tf

    if not isinstance(dataset, tf.data.Dataset):
        raise TypeError(
            f"run.dataset() takes a tf.data.Dataset, not {type(dataset).__name__}; arrays "
            "given to model.fit are digested under reprotrain.autolog()"
        )
    if getattr(dataset, _TAPPED, False):
        return dataset
    if data.ring is None:
        data.ring = _Ring()
    ring = data.ring
    spec = dataset.element_spec

    def digested(*element: Any) -> Any:
        # A tuple element arrives as positional arguments, any other as one argument.
        value: Any = element if isinstance(spec, tuple) else element[0]
        leaves = tf.nest.flatten(value, expand_composites=True)
        parts = [_leaf_fingerprint(tf, leaf) for leaf in leaves]
        ring.write(tf.fingerprint(tf.concat(parts, axis=1)) if len(parts) > 1 else parts[0])
        return value  # the write runs all the same: a function runs its stateful ops

    out = dataset.map(digested)  # sequential: the ring takes the batches in their order
    setattr(out, _TAPPED, True)
    return out


def _leaf_fingerprint(tf: Any, leaf: Any) -> Any:
    """[1, 8] uint8: FarmHash64 of the leaf's bytes (of each string's, for strings)."""
    if leaf.dtype == tf.string:
        return tf.fingerprint(tf.reshape(tf.fingerprint(tf.reshape(leaf, [-1])), [1, -1]))
    return tf.fingerprint(tf.reshape(leaf, [1, -1]))


def fit_data(run_data: ConsumedData, x: Any, y: Any, sample_weight: Any) -> tuple[Any, str | None]:
    """What `autolog` gives `fit` for its `x`: a tapped dataset, or the arrays themselves
    (digested whole); and what to warn of when the data cannot be digested."""
    import tensorflow as tf

    if isinstance(x, tf.data.Dataset):
        return tap(x, run_data), None
    leaves = [leaf for leaf in tf.nest.flatten([x, y, sample_weight]) if leaf is not None]
    if leaves and all(isinstance(v, np.ndarray | tf.Tensor) for v in leaves):
        run_data.add_whole(leaves)
        return x, None
    return x, (
        f"the data given to model.fit ({type(x).__name__}) is not fingerprinted: a divergence "
        "cannot be told to come from the data or the computation; give fit arrays or a "
        "tf.data.Dataset"
    )
