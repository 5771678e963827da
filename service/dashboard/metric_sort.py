"""The runs list sorted by a recorded metric's final value, with keyset paging.

A page is cut at a key (value, run id): runs with the metric come first, in the order asked
for, ties broken by run id in the same direction; runs without it come last, by run id.
Both parts walk an index (`run_metrics` (name, value, run_id), the runs' primary key), so a
page costs the same at any depth.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Select, and_, exists, literal, select, tuple_
from sqlalchemy.orm import Session

from service.dashboard import run_rows
from service.dashboard.run_rows import Filters, RunRow
from service.errors import MalformedBody
from service.persistence.distinct import distinct_values
from service.persistence.models import Experiment, Run, RunMetric
from service.runs import final_metrics
from service.schemas import MAX_ID

MAX_NAMES = 200  # metric names the runs page offers in its select box
KEY_CHARS = 60
NAME_CHARS = final_metrics.NAME_CHARS
_KEY = re.compile(r"^([-+0-9.eE]{1,40})?,([0-9]{1,10})$")


@dataclass(frozen=True)
class Key:
    """Where a page is cut: a run's value of the metric (None: it has none) and its id."""

    value: float | None
    run_id: int

    def text(self) -> str:
        return f"{'' if self.value is None else repr(self.value)},{self.run_id}"

    @classmethod
    def parse(cls, text: str) -> Key:
        """A key from a page URL; MalformedBody (422) if it is not one."""
        found = _KEY.match(text)
        run_id = int(found.group(2)) if found else 0
        try:
            value = float(found.group(1)) if found and found.group(1) else None
        except ValueError:
            value = math.nan
        if (
            not found
            or not 1 <= run_id <= MAX_ID
            or (value is not None and not math.isfinite(value))
        ):
            raise MalformedBody("a page key is '<finite number or nothing>,<run id>'")
        return cls(value, run_id)


@dataclass(frozen=True)
class Sort:
    metric: str
    descending: bool


@dataclass
class SortedPage:
    rows: list[RunRow]
    newer: Key | None  # `back` cursor of the previous page, if there is one
    older: Key | None  # `cursor` of the next page, if there is one


Found = list[tuple[Run, Experiment, float | None]]


def _with_metric(
    filters: Filters, sort: Sort, key: Key | None, forward: bool
) -> Select[tuple[Run, Experiment, float]]:
    up = sort.descending != forward  # walking towards larger values
    joined = run_rows.filtered(filters).join(
        RunMetric, and_(RunMetric.run_id == Run.id, RunMetric.name == sort.metric)
    )
    query = joined.add_columns(RunMetric.value)
    if key is not None and key.value is not None:
        here = tuple_(RunMetric.value, RunMetric.run_id)
        there = tuple_(literal(key.value), literal(key.run_id))
        query = query.where(here > there if up else here < there)
    if up:
        return query.order_by(RunMetric.value.asc(), RunMetric.run_id.asc())
    return query.order_by(RunMetric.value.desc(), RunMetric.run_id.desc())


def _without_metric(
    filters: Filters, sort: Sort, key: Key | None, forward: bool
) -> Select[tuple[Run, Experiment, None]]:
    up = sort.descending != forward
    has = exists().where(RunMetric.run_id == Run.id, RunMetric.name == sort.metric)
    query = run_rows.filtered(filters).where(~has).add_columns(literal(None))
    if key is not None and key.value is None:
        query = query.where(Run.id > key.run_id if up else Run.id < key.run_id)
    return query.order_by(Run.id.asc() if up else Run.id.desc())


def _walk(
    db: Session, filters: Filters, sort: Sort, key: Key | None, forward: bool, n: int
) -> Found:
    """Up to n runs after `key` in the page order (forward) or before it, nearest first."""
    parts = [_with_metric, _without_metric] if forward else [_without_metric, _with_metric]
    if key is not None and (key.value is None) == forward:
        parts = parts[1:]  # the cursor is in the second part already
    found: Found = []
    for part in parts:
        query: Select[Any] = part(filters, sort, key, forward).limit(n - len(found))
        found += [(run, experiment, value) for run, experiment, value in db.execute(query)]
        if len(found) >= n:
            break
    return found


def page(
    db: Session,
    filters: Filters,
    sort: Sort,
    *,
    limit: int,
    cursor: Key | None = None,
    back: Key | None = None,
) -> SortedPage:
    """One page of runs in the metric's order, cut after `cursor` or before `back`."""
    if back is not None:
        found = _walk(db, filters, sort, back, False, limit + 1)
        more_newer = len(found) > limit
        found = list(reversed(found[:limit]))
        keys = [Key(v, r.id) for r, _, v in found]
        rows = run_rows.rows_of(db, [(r, e) for r, e, _ in found])
        return SortedPage(
            rows, keys[0] if keys and more_newer else None, keys[-1] if keys else None
        )
    found = _walk(db, filters, sort, cursor, True, limit + 1)
    more_older = len(found) > limit
    found = found[:limit]
    keys = [Key(v, r.id) for r, _, v in found]
    rows = run_rows.rows_of(db, [(r, e) for r, e, _ in found])
    newer = keys[0] if keys and cursor is not None else None
    return SortedPage(rows, newer, keys[-1] if keys and more_older else None)


def values_of(
    db: Session, run_ids: Sequence[int], names: Sequence[str]
) -> dict[int, dict[str, float]]:
    """The final values of these metrics for these runs (a run without one lacks its key)."""
    found: dict[int, dict[str, float]] = {}
    if not run_ids or not names:
        return found
    # By run id only, on the primary key: given `name IN (...)` too, SQLite walks the names'
    # index through every run instead. A run holds at most REPRO_MAX_SORTABLE_METRICS rows.
    wanted = set(names)
    query = select(RunMetric.run_id, RunMetric.name, RunMetric.value).where(
        RunMetric.run_id.in_(run_ids)
    )
    for run_id, name, value in db.execute(query):
        if name in wanted:
            found.setdefault(run_id, {})[name] = value
    return found


def metric_names(db: Session, limit: int = MAX_NAMES) -> list[str]:
    """The names of recorded metrics, in order (one index lookup per name)."""
    return distinct_values(db, RunMetric.name, limit)
