"""model definitions and code bundles by digest

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-27 06:40:00

A model definition is a Keras architecture (JSON config or `.keras` archive) pushed once and
stored content-addressed; a spec names it by digest (`model.definition`). A code bundle is a
wheel stored the same way (`code`). The rows keep what the server found when it checked them
(layers and parameter count; the wheel's files with their digests and its entry points) and
who pushed them. `experiments.model_digest` / `code_digest` copy the spec's digests so "which
runs used it" is an indexed lookup. `runs.needs_code` marks runs only a worker that accepts
code may claim; `workers.accepts_code` is what the worker advertised.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def _pushed_columns(table: str) -> list[sa.Column[object] | sa.Constraint]:
    return [
        sa.Column("storage_url", sa.Text(), nullable=False),
        sa.Column("pushed_by_id", sa.Integer(), nullable=True),
        sa.Column("pushed_by", sa.String(length=200), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.ForeignKeyConstraint(
            ["pushed_by_id"], ["api_tokens.id"], name=f"fk_{table}_pushed_by_id"
        ),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("digest"),
    ]


def upgrade() -> None:
    op.create_table(
        "model_definitions",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("digest", sa.String(length=80), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("size", sa.BigInteger(), nullable=False),
        sa.Column("format", sa.String(length=40), nullable=False),
        sa.Column("layer_count", sa.Integer(), nullable=False),
        sa.Column("parameter_count", sa.BigInteger(), nullable=False),
        sa.Column("layers", sa.JSON(), nullable=False),
        *_pushed_columns("model_definitions"),
    )
    op.create_index(
        "ix_model_definitions_created_at", "model_definitions", ["created_at"], unique=False
    )
    op.create_table(
        "code_bundles",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("digest", sa.String(length=80), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("size", sa.BigInteger(), nullable=False),
        sa.Column("wheel_filename", sa.String(length=300), nullable=False),
        sa.Column("files", sa.JSON(), nullable=False),
        sa.Column("entry_points", sa.JSON(), nullable=False),
        *_pushed_columns("code_bundles"),
    )
    op.create_index("ix_code_bundles_created_at", "code_bundles", ["created_at"], unique=False)
    with op.batch_alter_table("experiments", schema=None) as batch_op:
        batch_op.add_column(sa.Column("model_digest", sa.String(length=80), nullable=True))
        batch_op.add_column(sa.Column("code_digest", sa.String(length=80), nullable=True))
        batch_op.create_index("ix_experiments_model_digest", ["model_digest"], unique=False)
        batch_op.create_index("ix_experiments_code_digest", ["code_digest"], unique=False)
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("needs_code", sa.Boolean(), server_default=sa.false(), nullable=False)
        )
    with op.batch_alter_table("workers", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("accepts_code", sa.Boolean(), server_default=sa.false(), nullable=False)
        )


def downgrade() -> None:
    with op.batch_alter_table("workers", schema=None) as batch_op:
        batch_op.drop_column("accepts_code")
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.drop_column("needs_code")
    with op.batch_alter_table("experiments", schema=None) as batch_op:
        batch_op.drop_index("ix_experiments_code_digest")
        batch_op.drop_index("ix_experiments_model_digest")
        batch_op.drop_column("code_digest")
        batch_op.drop_column("model_digest")
    op.drop_index("ix_code_bundles_created_at", table_name="code_bundles")
    op.drop_table("code_bundles")
    op.drop_index("ix_model_definitions_created_at", table_name="model_definitions")
    op.drop_table("model_definitions")
