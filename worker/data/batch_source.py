"""The contract between generators, architectures and the training loop (TensorFlow-free).

A generator factory is `factory(params: dict, *, batch_size: int) -> BatchSource`; one
that trains on a stored dataset also takes `data`: `factory(params, *, batch_size, data)`,
where `data` is the dataset's arrays by name (read-only NumPy, memory-mapped where the file
allows) or None when the job was given no dataset. `data` is passed only to factories whose
signature names it, so existing plugins keep working unchanged. An architecture factory is
`factory(params: dict, data: DataInfo) -> keras.Model` returning logits for
classification. Plugins implement these and register them as entry points.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class BatchSource:
    """A batch generator and what its labels mean.

    `batch_generator(indices, seed)` gets the batch's int64 sample ids `[B]` and its
    stateless seed `[2]` int64, and returns `(x, y)` or a mapping with keys "x" and "y"
    (other keys are allowed and ignored by training). It must use only stateless RNG ops.

    With `takes_epoch_seed`, it is called `batch_generator(indices, seed, epoch_seed)`:
    `epoch_seed` `[2]` int64 is the same for every batch of one epoch and differs between
    epochs (the batch seed with the batch id not yet folded in), e.g. to key a per-epoch
    permutation of sample ids. `eval_batch_generator(indices, seed)`, when given, makes the
    evaluation batches instead (e.g. from held-out rows); otherwise `batch_generator` does,
    on a stream of its own.
    """

    batch_generator: Callable[..., Any]
    num_classes: int | None = None  # None: regression targets
    vocab_size: int | None = None  # set when x holds integer token ids
    takes_epoch_seed: bool = False
    eval_batch_generator: Callable[[Any, Any], Any] | None = None
    # A finite dataset: an epoch's batches may cover at most `train_samples` sample ids, the
    # evaluation batches at most `eval_samples` (None: the generator makes any number).
    train_samples: int | None = None
    eval_samples: int | None = None


@dataclass(frozen=True)
class DataInfo:
    """Shapes and dtypes of one sample, as an architecture needs them."""

    x_shape: tuple[int, ...]
    x_dtype: str
    y_shape: tuple[int, ...]
    y_dtype: str
    num_classes: int | None
    vocab_size: int | None

    @property
    def output_dim(self) -> int:
        """Width of the model's output layer: classes, or the regression target width."""
        if self.num_classes is not None:
            return self.num_classes
        return self.y_shape[-1] if self.y_shape else 1
