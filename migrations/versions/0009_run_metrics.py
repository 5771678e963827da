"""final metric values per run

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-28 09:00:00

The runs page sorts by a recorded metric (final loss, final eval accuracy, any name a job
reports) with keyset paging. Reading that from `runs.metrics` (a JSON list of per-epoch rows)
would parse every run's metrics on every page; `run_metrics` keeps each run's final value
of each metric, with an index on (name, value, run_id) that the sort walks. Rows are written
when a run's result is recorded; this migration fills them from the results already stored.
"""

from __future__ import annotations

import math
from typing import Any

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None

BATCH = 1000  # runs read per query while filling
MAX_NAMES = 64  # the default of REPRO_MAX_SORTABLE_METRICS, for results stored before it
NAME_CHARS = 200
_NOT_METRICS = ("epoch", "step", "seconds")


def _finite(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None


def _finals(metrics: Any) -> dict[str, float]:
    # Kept as it was written here, so a later change of the service does not change history.
    finals: dict[str, float] = {}
    for row in metrics if isinstance(metrics, list) else []:
        if not isinstance(row, dict):
            continue
        for name, value in row.items():
            number = _finite(value)
            if number is None or name in _NOT_METRICS or len(str(name)) > NAME_CHARS:
                continue
            if name in finals or len(finals) < MAX_NAMES:
                finals[str(name)] = number
    return finals


def _backfill() -> None:
    bind = op.get_bind()
    runs = sa.table("runs", sa.column("id", sa.Integer()), sa.column("metrics", sa.JSON()))
    metrics = sa.table(
        "run_metrics",
        sa.column("run_id", sa.Integer()),
        sa.column("name", sa.String()),
        sa.column("value", sa.Float()),
    )
    last = 0
    while True:
        found = bind.execute(
            sa.select(runs.c.id, runs.c.metrics)
            .where(runs.c.id > last)
            .order_by(runs.c.id)
            .limit(BATCH)
        ).all()
        if not found:
            return
        rows = [
            {"run_id": run_id, "name": name, "value": value}
            for run_id, doc in found
            for name, value in _finals(doc).items()
        ]
        if rows:
            bind.execute(sa.insert(metrics), rows)
        last = found[-1][0]


def upgrade() -> None:
    op.create_table(
        "run_metrics",
        sa.Column("run_id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("value", sa.Float(), nullable=False),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"]),
        sa.PrimaryKeyConstraint("run_id", "name"),
    )
    op.create_index(
        "ix_run_metrics_name_value_run", "run_metrics", ["name", "value", "run_id"], unique=False
    )
    _backfill()


def downgrade() -> None:
    op.drop_index("ix_run_metrics_name_value_run", table_name="run_metrics")
    op.drop_table("run_metrics")
