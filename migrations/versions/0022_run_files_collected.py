"""archived runs' files collected

Revision ID: 0022
Revises: 0021
Create Date: 2026-12-05 14:30:00

An archived run's files (checkpoints, model, log) are removed once it has been archived
longer than the retention (`repro admin collect`): `runs.files_collected_at` says when; the
run's record stays.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0022"
down_revision = "0021"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("runs", sa.Column("files_collected_at", sa.DateTime(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("files_collected_at")
