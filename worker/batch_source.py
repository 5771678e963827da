"""The contract between generators, architectures and the training loop (TensorFlow-free).

A generator factory is `factory(params: dict, *, batch_size: int) -> BatchSource`; an
architecture factory is `factory(params: dict, data: DataInfo) -> keras.Model` returning
logits for classification. Plugins implement these and register them as entry points.
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
    """

    batch_generator: Callable[[Any, Any], Any]
    num_classes: int | None = None  # None: regression targets
    vocab_size: int | None = None  # set when x holds integer token ids


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
