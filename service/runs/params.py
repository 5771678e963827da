"""An experiment's parameters: every leaf field of its spec, one row each in
`experiment_params`, so runs are searched by parameter (`params.training.epochs > 3`) on an
index instead of reading every spec."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator, Mapping
from typing import Any

from service.persistence.models import ExperimentParam
from worker.compare.spec_diff import flatten_spec

NAME_CHARS = 200  # the columns' widths: a longer path or value is not searchable
TEXT_CHARS = 200


def param_value(value: Any) -> tuple[float | None, str | None]:
    """(num, text) of a spec value: a finite number as `num`; a string, a boolean (`true`,
    `false`) or a list (as JSON) as `text`; (None, None) for what no search can name."""
    if isinstance(value, bool):
        return None, "true" if value else "false"
    if isinstance(value, int | float):
        number = float(value)
        return (number, None) if math.isfinite(number) else (None, None)
    if isinstance(value, str):
        return (None, value) if len(value) <= TEXT_CHARS else (None, None)
    if value is None:
        return None, None
    text = json.dumps(value, separators=(",", ":"), sort_keys=True)
    return (None, text) if len(text) <= TEXT_CHARS else (None, None)


def param_rows(experiment_id: int, spec: Mapping[str, Any]) -> Iterator[ExperimentParam]:
    """The rows of an experiment's searchable parameters."""
    for name, value in flatten_spec(spec).items():
        num, text = param_value(value)
        if len(name) <= NAME_CHARS and (num is not None or text is not None):
            yield ExperimentParam(experiment_id=experiment_id, name=name, num=num, text=text)
