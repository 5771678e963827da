"""The lists' `archived` choice, for anything archived by an `archived_at` column: "false"
leaves the archived out (the default), "true" keeps only them, "any" keeps both."""

from __future__ import annotations

from typing import Any, Literal

from sqlalchemy import Select
from sqlalchemy.orm import InstrumentedAttribute

ArchivedChoice = Literal["false", "true", "any"]


def narrowed(query: Select[Any], column: InstrumentedAttribute[Any], archived: str) -> Select[Any]:
    """`query` with the rows the choice leaves out removed."""
    if archived == "false":
        return query.where(column.is_(None))
    if archived == "true":
        return query.where(column.is_not(None))
    return query
