"""unique worker names, who reported each run, kept comparison reports

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-23 20:00:00

A worker's name becomes its identity (unique; re-traces are pinned to it by name). Names
registered more than once before this revision keep their newest worker; the older ones
are renamed `<name>~<id>` so nothing is lost. `runs.reported_by` records which worker and
token reported a result and what the server checked; `comparison_reports` keeps the report
of two finished runs so `GET /compare` computes it once.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def _rename_duplicate_workers() -> None:
    bind = op.get_bind()
    workers = sa.table("workers", sa.column("id", sa.Integer), sa.column("name", sa.String))
    rows = bind.execute(sa.select(workers.c.id, workers.c.name).order_by(workers.c.id.desc()))
    seen: set[str] = set()
    for worker_id, name in rows.all():
        if name in seen:
            renamed = f"{name[:190]}~{worker_id}"
            bind.execute(workers.update().where(workers.c.id == worker_id).values(name=renamed))
        seen.add(name)


def upgrade() -> None:
    _rename_duplicate_workers()
    with op.batch_alter_table("workers", schema=None) as batch_op:
        batch_op.create_unique_constraint("uq_workers_name", ["name"])
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("reported_by", sa.JSON(), nullable=True))
    op.create_table(
        "comparison_reports",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("run_a_id", sa.Integer(), nullable=False),
        sa.Column("run_b_id", sa.Integer(), nullable=False),
        sa.Column("report", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.ForeignKeyConstraint(["run_a_id"], ["runs.id"]),
        sa.ForeignKeyConstraint(["run_b_id"], ["runs.id"]),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("run_a_id", "run_b_id", name="uq_comparison_reports_ab"),
    )


def downgrade() -> None:
    op.drop_table("comparison_reports")
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.drop_column("reported_by")
    with op.batch_alter_table("workers", schema=None) as batch_op:
        batch_op.drop_constraint("uq_workers_name", type_="unique")
