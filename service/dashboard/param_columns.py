"""Parameter columns of the runs page: the spec fields a viewer picked, and, unasked, the
ones that differ between the runs on the page (up to AUTO of them), read from
`experiment_params` by experiment id in one query per page."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from service.persistence.distinct import distinct_values
from service.persistence.models import ExperimentParam

MAX_PICKED = 6  # parameter columns a URL may name
AUTO = 4  # columns shown unasked: the parameters that differ on the page
MAX_NAMES = 500  # parameter names the select box offers
# Shown in columns of their own already, or differing by construction between experiments.
NOT_AUTO = frozenset({"name", "seed"})

ParamValues = dict[int, dict[str, Any]]  # experiment id -> parameter -> number or text


def values_by_experiment(db: Session, experiment_ids: Sequence[int]) -> ParamValues:
    """Every searchable parameter of these experiments (on the table's primary key)."""
    found: ParamValues = {}
    if not experiment_ids:
        return found
    query = select(
        ExperimentParam.experiment_id, ExperimentParam.name, ExperimentParam.num,
        ExperimentParam.text,
    ).where(ExperimentParam.experiment_id.in_(set(experiment_ids)))  # fmt: skip
    for experiment_id, name, num, text in db.execute(query):
        found.setdefault(experiment_id, {})[name] = text if num is None else num
    return found


def differing(values: ParamValues, experiment_ids: Sequence[int]) -> list[str]:
    """The parameters whose value (or absence) is not the same for all these experiments, in
    name order, without the ones NOT_AUTO lists; none for fewer than two experiments."""
    ids = list(dict.fromkeys(experiment_ids))
    if len(ids) < 2:
        return []
    names = sorted({n for i in ids for n in values.get(i, {})} - NOT_AUTO)
    missing = object()
    return [n for n in names if len({repr(values.get(i, {}).get(n, missing)) for i in ids}) > 1]


def shown(picked: Sequence[str], values: ParamValues, experiment_ids: Sequence[int]) -> list[str]:
    """The page's parameter columns: the picked ones, then up to AUTO that differ."""
    auto = [n for n in differing(values, experiment_ids) if n not in picked][:AUTO]
    return list(dict.fromkeys([*picked, *auto]))


def names(db: Session, limit: int = MAX_NAMES) -> list[str]:
    """The names of stored parameters, in order (one index lookup per name)."""
    return distinct_values(db, ExperimentParam.name, limit)


def label(name: str) -> str:
    """A column's heading: the last two parts of the path (`params.learning_rate`)."""
    return ".".join(name.split(".")[-2:])
