"""experiments, datasets, model definitions and code bundles archived; stored files collected

Revision ID: 0023
Revises: 0022
Create Date: 2026-12-05 17:00:00

Experiments, datasets, model definitions and code bundles are archived like runs
(`archived_at`); a stored file's bytes are removed once it has been archived longer than
the retention and no run in the lists used it (`files_collected_at` says when); its record
stays, and pushing the same bytes again restores it.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0023"
down_revision = "0022"
branch_labels = None
depends_on = None

STORED = ("datasets", "model_definitions", "code_bundles")


def upgrade() -> None:
    op.add_column("experiments", sa.Column("archived_at", sa.DateTime(), nullable=True))
    for table in STORED:
        op.add_column(table, sa.Column("archived_at", sa.DateTime(), nullable=True))
        op.add_column(table, sa.Column("files_collected_at", sa.DateTime(), nullable=True))


def downgrade() -> None:
    for table in STORED:
        with op.batch_alter_table(table) as batch:
            batch.drop_column("files_collected_at")
            batch.drop_column("archived_at")
    with op.batch_alter_table("experiments") as batch:
        batch.drop_column("archived_at")
