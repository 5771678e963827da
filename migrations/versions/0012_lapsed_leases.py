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

from alembic import op

from migrations.schema_ops import add_reference_column

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    add_reference_column("runs", "lapsed_holder_id", "workers", "fk_runs_lapsed_holder_id")


def downgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("lapsed_holder_id")
