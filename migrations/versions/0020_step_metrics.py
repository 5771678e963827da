"""per-step metrics

Revision ID: 0020
Revises: 0019
Create Date: 2026-12-05 13:30:00

A result carries per-step rows (the loss every k steps, at most 1,000 a run; a script's
metrics logged with a step): `runs.step_metrics`, for the run page's curves by step.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0020"
down_revision = "0019"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("runs", sa.Column("step_metrics", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("step_metrics")
