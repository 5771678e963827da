"""indexes for the runs page now that every query filters on kind

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-21 20:00:00

`GET /runs` filters on `kind` (trainings by default) and orders by id, optionally by
status too; without these indexes its count and page scan the whole table.
"""

from __future__ import annotations

from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_runs_kind_id", "runs", ["kind", "id"], unique=False)
    op.create_index("ix_runs_kind_status_id", "runs", ["kind", "status", "id"], unique=False)


def downgrade() -> None:
    op.drop_index("ix_runs_kind_status_id", table_name="runs")
    op.drop_index("ix_runs_kind_id", table_name="runs")
