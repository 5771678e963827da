"""datasets pushed by digest

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-23 22:00:00

A dataset is a file pushed once and stored content-addressed; a spec names it by digest
(`dataset.data`). The row keeps what the reader found (format, samples, arrays with their
shapes and dtypes) and who pushed it.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "datasets",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("digest", sa.String(length=80), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("size", sa.BigInteger(), nullable=False),
        sa.Column("format", sa.String(length=40), nullable=False),
        sa.Column("samples", sa.BigInteger(), nullable=False),
        sa.Column("arrays", sa.JSON(), nullable=False),
        sa.Column("storage_url", sa.Text(), nullable=False),
        sa.Column("pushed_by_id", sa.Integer(), nullable=True),
        sa.Column("pushed_by", sa.String(length=200), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.ForeignKeyConstraint(
            ["pushed_by_id"], ["api_tokens.id"], name="fk_datasets_pushed_by_id"
        ),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("digest"),
    )
    op.create_index("ix_datasets_created_at", "datasets", ["created_at"], unique=False)


def downgrade() -> None:
    op.drop_index("ix_datasets_created_at", table_name="datasets")
    op.drop_table("datasets")
