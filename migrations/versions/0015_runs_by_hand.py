"""runs recorded by hand

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-05 05:00:00

A training script run by hand (`python train.py` with the service configured) records its
run on the server: `runs.origin` is "by_hand" for those, "worker" for every run a worker
trains (all runs before this revision). A run by hand is never claimed; a rerun of it
retrains it on a worker.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column(
        "runs", sa.Column("origin", sa.String(20), nullable=False, server_default="worker")
    )


def downgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("origin")
