"""Each run's final value of every metric it recorded, kept in `run_metrics` so the runs page
sorts by a metric on an index instead of reading every run's per-epoch rows."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from sqlalchemy import delete
from sqlalchemy.orm import Session

from service.persistence.models import Run, RunMetric

NAME_CHARS = 200  # the column's width; a longer name is shown on the run page, not sortable
# Counters of a metrics row, not measurements worth sorting by.
NOT_METRICS = ("epoch", "step", "seconds")


def _finite(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None


def finals(metrics: Sequence[Any] | None, *, max_names: int) -> dict[str, float]:
    """The last finite value of each metric in per-epoch rows, for at most `max_names`
    names (the first ones recorded: loss and the spec's metrics come before extras)."""
    found: dict[str, float] = {}
    for row in metrics or []:
        if not isinstance(row, dict):
            continue
        for name, value in row.items():
            number = _finite(value)
            if number is None or name in NOT_METRICS or len(str(name)) > NAME_CHARS:
                continue
            if name in found or len(found) < max_names:
                found[str(name)] = number
    return found


def record(db: Session, run: Run, *, max_names: int) -> None:
    """Replace the run's final metric values with those of its recorded metrics."""
    db.execute(delete(RunMetric).where(RunMetric.run_id == run.id))
    db.add_all(
        RunMetric(run_id=run.id, name=name, value=value)
        for name, value in finals(run.metrics, max_names=max_names).items()
    )
