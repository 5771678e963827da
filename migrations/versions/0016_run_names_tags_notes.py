"""run names, tags and notes

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-05 09:00:00

A run gets a name, free-text notes and tags (`PATCH /runs/{id}`). The tags are kept twice:
as a JSON list on the run, which a page of runs reads with its columns, and one row each
in `run_tags`, which the `tag` filter of the runs list reads through its index.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("runs", sa.Column("name", sa.String(200), nullable=True))
    op.add_column("runs", sa.Column("notes", sa.Text(), nullable=True))
    op.add_column("runs", sa.Column("tags", sa.JSON(), nullable=True))
    op.create_table(
        "run_tags",
        sa.Column("run_id", sa.Integer(), nullable=False),
        sa.Column("tag", sa.String(64), nullable=False),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], name="fk_run_tags_run_id"),
        sa.PrimaryKeyConstraint("run_id", "tag", name="pk_run_tags"),
    )
    op.create_index("ix_run_tags_tag_run_id", "run_tags", ["tag", "run_id"])


def downgrade() -> None:
    op.drop_index("ix_run_tags_tag_run_id", table_name="run_tags")
    op.drop_table("run_tags")
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("tags")
        batch.drop_column("notes")
        batch.drop_column("name")
