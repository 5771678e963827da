"""the worker whose lease lapsed may take its run back

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-04 14:00:00

A run whose lease lapsed goes back to the queue, but the worker that held it may still be
training it (the API was away, or the worker's network). `runs.lapsed_holder_id` names that
worker until another claims the run: its next heartbeat or report takes the run back on the
same attempt instead of losing the work.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.add_column(sa.Column("lapsed_holder_id", sa.Integer(), nullable=True))
        batch.create_foreign_key(
            "fk_runs_lapsed_holder_id", "workers", ["lapsed_holder_id"], ["id"]
        )


def downgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.drop_constraint("fk_runs_lapsed_holder_id", type_="foreignkey")
        batch.drop_column("lapsed_holder_id")
