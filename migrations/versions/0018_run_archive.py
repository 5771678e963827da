"""archived runs

Revision ID: 0018
Revises: 0017
Create Date: 2026-12-05 09:00:00

A run that has ended can be archived (`POST /runs/{id}/archive`): `runs.archived_at` says
when. Lists leave archived runs out unless asked for them; nothing of the run is removed.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("runs", sa.Column("archived_at", sa.DateTime(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("archived_at")
