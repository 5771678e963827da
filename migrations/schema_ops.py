"""Schema changes the revisions share."""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op


def add_reference_column(table: str, column: str, target: str, name: str) -> None:
    """A nullable integer column referencing `target`.id, named `name` where constraints have
    names. On SQLite a plain ADD COLUMN with its REFERENCES clause: rebuilding the table
    (batch mode) would drop a table whose rows others point at."""
    if op.get_bind().dialect.name == "sqlite":
        op.execute(f"ALTER TABLE {table} ADD COLUMN {column} INTEGER REFERENCES {target} (id)")
    else:
        op.add_column(table, sa.Column(column, sa.Integer(), nullable=True))
        op.create_foreign_key(name, table, target, [column], ["id"])
