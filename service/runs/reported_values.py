"""Checks of the numbers a worker reports in progress and per-epoch metrics: counters are
counters and measurements are numbers a double holds, so what is stored can be shown."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from service.schemas import MAX_ID

# Counters a job reports; anything else numeric is a measurement (loss, accuracy, seconds).
COUNTERS = ("epoch", "epochs", "step", "batch")
# Measurements a job always reports as numbers; other keys (event, path, fingerprint) are text.
MEASUREMENTS = ("loss", "seconds")


def _counter_problem(loc: str, value: Any) -> str | None:
    if value is None:
        return None  # not known yet
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_ID:
        return f"{loc} must be a whole number in [0, {MAX_ID}]"
    return None


def _measurement_problem(loc: str, value: Any, *, required: bool) -> str | None:
    numeric = isinstance(value, int | float) and not isinstance(value, bool)
    if not numeric:
        if required or isinstance(value, bool):
            return f"{loc} must be a number"
        return None  # text, null or a structure: shown as it is
    try:
        finite = math.isfinite(float(value))
    except OverflowError:
        finite = False
    return None if finite else f"{loc} must be a finite number a double can hold"


def _problems(doc: Mapping[str, Any], prefix: str) -> list[str]:
    problems = []
    for key, value in doc.items():
        loc = f"{prefix}{key}"
        if key in COUNTERS:
            problem = _counter_problem(loc, value)
        else:
            problem = _measurement_problem(loc, value, required=key in MEASUREMENTS)
        if problem is not None:
            problems.append(problem)
    return problems


def checked_progress(progress: dict[str, Any] | None) -> dict[str, Any] | None:
    """The progress of a heartbeat, refused (ValueError) if a counter or number is odd."""
    if progress is not None and (problems := _problems(progress, "progress.")):
        raise ValueError("; ".join(problems))
    return progress


def metrics_problems(metrics: list[Any], field: str = "metrics") -> list[str]:
    """What is wrong with a result's metrics rows, per epoch or per step (none: they can be
    stored)."""
    problems = []
    for i, row in enumerate(metrics):
        if not isinstance(row, Mapping):
            problems.append(f"{field}.{i} must be a mapping")
        else:
            problems += _problems(row, f"{field}.{i}.")
    return problems
