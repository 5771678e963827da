"""hardware classes: workers advertise theirs and their pool; runs may require one

Revision ID: 0024
Revises: 0023
Create Date: 2026-12-05 17:30:00

A worker advertises its hardware class (`gpu:<product>:sm<N>:...`, `cpu:<vendor>:...`) and
the pool it belongs to; a run may require a class or a leading part of one (`gpu`), set by
its spec's `environment.hardware` or, for a rerun, its run's class; `hardware_override`
says a rerun was sent elsewhere on request.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0024"
down_revision = "0023"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("workers", sa.Column("hardware_class", sa.String(300), nullable=True))
    op.add_column("workers", sa.Column("pool", sa.String(200), nullable=True))
    op.add_column("runs", sa.Column("required_hardware", sa.String(300), nullable=True))
    op.add_column("runs", sa.Column("hardware_override", sa.String(300), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("hardware_override")
        batch.drop_column("required_hardware")
    with op.batch_alter_table("workers") as batch:
        batch.drop_column("pool")
        batch.drop_column("hardware_class")
