"""The shapes a Keras definition's tensors have, as the shape rules see them: a tensor by its
shape, one layer call's arguments, and the small readers every rule shares. TF-free."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

Shape = tuple[int | None, ...]


class ShapeError(ValueError):
    """A layer cannot take the shapes it is given, or its config cannot be read."""


@dataclass(frozen=True)
class Tensor:
    """A Keras tensor of a call's arguments, by its shape."""

    shape: Shape


@dataclass
class Call:
    """One call of a layer: its arguments, with every Keras tensor a `Tensor`."""

    args: list[Any]
    kwargs: dict[str, Any] = field(default_factory=dict)

    def shape(self, index: int = 0, name: str | None = None) -> Shape:
        """The shape of one tensor argument (by keyword `name`, else position `index`)."""
        value = self.argument(index, name)
        if not isinstance(value, Tensor):
            raise ShapeError(f"argument {name or index} is not a tensor")
        return value.shape

    def argument(self, index: int, name: str | None = None) -> Any:
        """One argument by keyword `name`, else by position; None when not given."""
        if name is not None and name in self.kwargs:
            return self.kwargs[name]
        return self.args[index] if index < len(self.args) else None

    def shapes(self) -> list[Shape]:
        """The shapes of a list of tensors given as the first argument (merge layers)."""
        first = self.argument(0)
        if not isinstance(first, list) or not all(isinstance(t, Tensor) for t in first):
            raise ShapeError("it takes a list of tensors")
        return [t.shape for t in first]


def positive(value: Any, what: str) -> int:
    """`value` as a positive int; ShapeError otherwise."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ShapeError(f"{what} must be a positive integer, not {value!r}")
    return value


def ints(value: Any, rank: int, what: str, *, low: int = 1) -> list[int]:
    """An int or a list of `rank` ints (each at least `low`), as a list."""
    items = value if isinstance(value, list | tuple) else [value] * rank
    if len(items) != rank or not all(
        isinstance(v, int) and not isinstance(v, bool) and v >= low for v in items
    ):
        raise ShapeError(f"{what} must be {rank} integers of at least {low}, not {value!r}")
    return list(items)


def axis_index(axis: Any, rank: int) -> int:
    if isinstance(axis, bool) or not isinstance(axis, int) or not -rank <= axis < rank:
        raise ShapeError(f"axis {axis!r} is outside a tensor of rank {rank}")
    return axis % rank


def elements(shape: Shape) -> int | None:
    """Values per example of a tensor (its size without the batch axis); None if unknown."""
    rest = shape[1:]
    return None if any(d is None for d in rest) else math.prod(d for d in rest if d is not None)


# A rule: (layer config, call) -> the shapes of the call's outputs.
Rule = Callable[[dict[str, Any], Call], list[Shape]]
