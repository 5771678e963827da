"""gangs: a run may train on several workers at once, each a member of its gang

Revision ID: 0025
Revises: 0024
Create Date: 2026-12-06 00:00:00

`runs.hosts` is the spec's `distribution.hosts`. A worker that can join gangs says so on
each try (`workers.gang_seen_at`); it joins a queued multi-host run's forming gang as a
`gang_members` row, which gets its rank when the gang is complete and the run starts;
`runs.gang` keeps the members of the attempt that trains (provenance once it finishes).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0025"
down_revision = "0024"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("runs", sa.Column("hosts", sa.Integer(), nullable=False, server_default="1"))
    op.add_column("runs", sa.Column("gang", sa.JSON(), nullable=True))
    op.add_column("workers", sa.Column("gang_seen_at", sa.DateTime(), nullable=True))
    op.create_table(
        "gang_members",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column(
            "run_id",
            sa.Integer(),
            sa.ForeignKey("runs.id", name="fk_gang_members_run_id"),
            nullable=False,
        ),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column(
            "worker_id",
            sa.Integer(),
            sa.ForeignKey("workers.id", name="fk_gang_members_worker_id"),
            nullable=False,
        ),
        sa.Column("address", sa.String(300), nullable=False),
        sa.Column("rank", sa.Integer(), nullable=True),
        sa.Column("joined_at", sa.DateTime(), nullable=False),
        sa.Column("seen_at", sa.DateTime(), nullable=False),
        sa.Column("done_at", sa.DateTime(), nullable=True),
        sa.UniqueConstraint("worker_id", name="uq_gang_members_worker_id"),
    )
    op.create_index("ix_gang_members_run_id", "gang_members", ["run_id"])


def downgrade() -> None:
    op.drop_index("ix_gang_members_run_id", table_name="gang_members")
    op.drop_table("gang_members")
    with op.batch_alter_table("workers") as batch:
        batch.drop_column("gang_seen_at")
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("gang")
        batch.drop_column("hosts")
