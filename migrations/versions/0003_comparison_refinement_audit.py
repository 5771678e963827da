"""comparison refinements and reproducibility audits

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-21 10:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("kind", sa.String(length=20), server_default="train", nullable=False)
        )
        batch_op.add_column(sa.Column("job_options", sa.JSON(), nullable=True))
        batch_op.add_column(sa.Column("required_worker", sa.String(length=200), nullable=True))
        batch_op.add_column(sa.Column("audit_id", sa.Integer(), nullable=True))
        batch_op.create_foreign_key("fk_runs_audit_id", "runs", ["audit_id"], ["id"])
        batch_op.create_index(batch_op.f("ix_runs_audit_id"), ["audit_id"], unique=False)
    op.create_table(
        "refinements",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("run_a_id", sa.Integer(), nullable=False),
        sa.Column("run_b_id", sa.Integer(), nullable=False),
        sa.Column("epoch", sa.Integer(), nullable=False),
        sa.Column("from_epoch", sa.Integer(), nullable=False),
        sa.Column("refine_a_id", sa.Integer(), nullable=False),
        sa.Column("refine_b_id", sa.Integer(), nullable=False),
        sa.Column("report", sa.JSON(), nullable=True),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.ForeignKeyConstraint(["run_a_id"], ["runs.id"]),
        sa.ForeignKeyConstraint(["run_b_id"], ["runs.id"]),
        sa.ForeignKeyConstraint(["refine_a_id"], ["runs.id"]),
        sa.ForeignKeyConstraint(["refine_b_id"], ["runs.id"]),
        sa.PrimaryKeyConstraint("id"),
    )


def downgrade() -> None:
    op.drop_table("refinements")
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_runs_audit_id"))
        batch_op.drop_constraint("fk_runs_audit_id", type_="foreignkey")
        batch_op.drop_column("audit_id")
        batch_op.drop_column("required_worker")
        batch_op.drop_column("job_options")
        batch_op.drop_column("kind")
