"""The field a misspelled spec field probably meant ("did you mean 'batch_size'?"), for the
API's answer to a submit and for `repro validate` alike.

Imports no TensorFlow: the API server uses it.
"""

from __future__ import annotations

import difflib
import types
import typing
from typing import Any

from pydantic import BaseModel

from worker.errors import SpecError
from worker.spec import ExperimentSpec

EXTRA_FIELD = "Extra inputs are not permitted"  # pydantic's message for an unknown field


def suggested_field(loc: str) -> str | None:
    """The dotted path of the spec field closest to `loc`, a path naming no field; None when
    no field of that model is close."""
    *parents, name = loc.split(".")
    close = difflib.get_close_matches(name, _field_names(parents), n=1, cutoff=0.6)
    return ".".join([*parents, close[0]]) if name and close else None


def with_suggestion(error: dict[str, str]) -> dict[str, str]:
    """The error, with `suggestion` (the field probably meant) where its path names no field."""
    if error.get("msg") != EXTRA_FIELD or not (found := suggested_field(error.get("loc", ""))):
        return error
    return {**error, "suggestion": found}


def suggesting(exc: SpecError) -> SpecError:
    """The same error whose messages, and each field error's, end in "did you mean ...?"
    where a path names no field and one is close to it."""
    errors = [with_suggestion(e) for e in exc.errors]
    if not any("suggestion" in e for e in errors):
        return exc
    message = str(exc)
    for e in errors:
        if "suggestion" in e:
            hinted = f"{e['msg']}; did you mean '{e['suggestion'].rsplit('.', 1)[-1]}'?"
            message = message.replace(f"{e['loc']}: {e['msg']}", f"{e['loc']}: {hinted}", 1)
            e["msg"] = hinted
    return SpecError(message, errors=errors)


def _field_names(path: list[str]) -> list[str]:
    """The field names of the spec model at a dotted path ([] if it names no model)."""
    model: type[BaseModel] | None = ExperimentSpec
    for part in path:
        field = model.model_fields.get(part) if model is not None else None
        model = _model_in(field.annotation) if field is not None else None
    return list(model.model_fields) if model is not None else []


def _model_in(annotation: Any) -> type[BaseModel] | None:
    """The model a field holds, looking inside Optional, unions and Annotated."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType, typing.Annotated):
        for arg in typing.get_args(annotation):
            if (found := _model_in(arg)) is not None:
                return found
    return None
