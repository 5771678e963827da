"""Bounds on free-form JSON a client sends: depth, number of values, and encoded size.

Progress, failure details, provenance and metrics are stored as sent and shown on every
page of their run; unbounded, one deeply nested document makes those pages fail for good
(the response serializer stops at a fixed depth). A field typed `bounded_json(...)`
refuses such a document with 422 and the path where it went past a bound.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel

# Python refuses to convert longer digit strings to int (sys.get_int_max_str_digits()).
MAX_INT_DIGITS = 4300


def exceeds_int_digits(exc: ValueError) -> bool:
    """Whether `exc` is Python refusing an integer past MAX_INT_DIGITS (text to int or back)."""
    return "integer string conversion" in str(exc)


@dataclass(frozen=True)
class JsonBounds:
    """How deep (containers inside containers), how many values (keys count as values)
    and how many bytes of compact JSON one document may have."""

    max_depth: int
    max_values: int
    max_bytes: int


# Progress is a few counters; failure details a few messages; a result's provenance and
# per-epoch metrics can be long (10,000 epochs of a few metrics) but are never deep.
PROGRESS = JsonBounds(max_depth=8, max_values=1_000, max_bytes=64 * 1024)
DETAILS = JsonBounds(max_depth=16, max_values=20_000, max_bytes=512 * 1024)
RESULT = JsonBounds(max_depth=16, max_values=500_000, max_bytes=16 * 1024 * 1024)


def _children(item: Any, path: str) -> Iterator[tuple[str, Any]]:
    if isinstance(item, dict):
        for key, sub in item.items():
            yield f"{path}.{key}" if path else str(key), sub
    elif isinstance(item, list | tuple):
        for i, sub in enumerate(item):
            yield f"{path}.{i}" if path else str(i), sub


def json_problem(value: Any, bounds: JsonBounds) -> str | None:
    """What in `value` is past `bounds` (with its path), or None when it is within them."""
    stack: list[tuple[str, Any, int]] = [("", value, 0)]
    values = 0
    while stack:  # iterative: a document nested thousands deep must not exhaust the stack
        path, item, depth = stack.pop()
        if isinstance(item, dict | list | tuple):
            if depth >= bounds.max_depth:
                where = f" at {_short(path)}" if path else ""
                return f"nests deeper than {bounds.max_depth} levels{where}"
            for child_path, child in _children(item, path):
                values += 2 if isinstance(item, dict) else 1
                if values > bounds.max_values:
                    return f"has more than {bounds.max_values} keys and values"
                stack.append((child_path, child, depth + 1))
    size = len(json.dumps(value, separators=(",", ":"), default=str))
    if size > bounds.max_bytes:
        return f"is {size} bytes of JSON, more than {bounds.max_bytes}"
    return None


def _short(path: str, keep: int = 120) -> str:
    return path if len(path) <= keep else path[:keep] + "…"


def check_json(value: Any, bounds: JsonBounds) -> Any:
    """`value` unchanged if it is within `bounds`; ValueError (422 at the schema) otherwise."""
    problem = json_problem(value, bounds)
    if problem is not None:
        raise ValueError(problem)
    return value


def bounded_json(bounds: JsonBounds) -> AfterValidator:
    """A pydantic validator bounding a free-form JSON field: `Annotated[dict, bounded_json(B)]`."""
    return AfterValidator(lambda value: check_json(value, bounds))


def bounded_fields(*names: str, bounds: JsonBounds) -> AfterValidator:
    """A validator bounding the named free-form fields of a model (each field on its own)."""

    def check(model: BaseModel) -> BaseModel:
        for name in names:
            problem = json_problem(getattr(model, name), bounds)
            if problem is not None:
                raise ValueError(f"{name} {problem}")
        return model

    return AfterValidator(check)


def bounded_extras(bounds: JsonBounds) -> AfterValidator:
    """A validator bounding the extra (undeclared) fields a model allows, together."""

    def check(model: BaseModel) -> BaseModel:
        problem = json_problem(model.model_extra or {}, bounds)
        if problem is not None:
            raise ValueError(f"extra fields: {problem}")
        return model

    return AfterValidator(check)


BoundedProgress = Annotated[dict[str, Any], bounded_json(PROGRESS)]
BoundedDetails = Annotated[dict[str, Any], bounded_json(DETAILS)]
