"""`json_rows(...)`: the rows a (sub)query finds, as one JSON array the database builds.

Selected in a scalar subquery, it lets one statement return a row together with the rows
that belong to it (a run with its trace points), where a second statement would cost a
read about as much again as the first (a round trip, and each statement's own work in the
ORM and the driver). Each row becomes an array of the given values, in their order; JSON
columns are embedded as JSON, so a value comes back as it would in a row of its own. No
rows give `[]`. The order of the rows is not defined: select a column to sort them by.

PostgreSQL builds it with `json_agg(json_build_array(...))`, SQLite (and any other
database) with `json_group_array(json_array(...))`. Numbers travel as JSON text: integers
and strings come back unchanged, so use it for those (and JSON) columns only.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import JSON
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.functions import FunctionElement


class json_rows(FunctionElement[Any]):
    """The JSON array of the rows found, each the array of these columns' values."""

    type = JSON()
    name = "json_rows"
    inherit_cache = True


@compiles(json_rows, "postgresql")
def _postgresql(element: json_rows, compiler: SQLCompiler, **kw: Any) -> str:
    values = compiler.process(element.clauses, **kw)
    return f"coalesce(json_agg(json_build_array({values})), '[]'::json)"


@compiles(json_rows)
def _sqlite(element: json_rows, compiler: SQLCompiler, **kw: Any) -> str:
    # SQLite keeps JSON as text: json(...) embeds it as JSON instead of as a string.
    values = ", ".join(
        f"json({compiler.process(value, **kw)})"
        if isinstance(value.type, JSON)
        else compiler.process(value, **kw)
        for value in element.clauses
    )
    return f"json_group_array(json_array({values}))"
