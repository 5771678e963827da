"""experiments by name

Revision ID: 0021
Revises: 0020
Create Date: 2026-12-05 14:00:00

Experiments of one name are a project (three seeds of one spec are three experiments): the
projects page groups and pages them by name, and a search `experiment = NAME` finds their
runs, both on this index.
"""

from __future__ import annotations

from alembic import op

revision = "0021"
down_revision = "0020"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("experiments") as batch_op:
        batch_op.create_index(batch_op.f("ix_experiments_name"), ["name"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("experiments") as batch_op:
        batch_op.drop_index(batch_op.f("ix_experiments_name"))
