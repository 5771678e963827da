"""what threatens reproducibility on each worker

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-30 09:00:00

A worker runs the reproducibility checks of `repro doctor` when it starts and sends what
they flagged (TF32 on an Ampere GPU, thread counts left to the machine, CUDA libraries
other than the image's lock...) with its registration. `workers.readiness_flags` keeps that
list; null for workers registered before the checks existed, [] when nothing was flagged.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("workers") as batch:
        batch.add_column(sa.Column("readiness_flags", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("workers") as batch:
        batch.drop_column("readiness_flags")
