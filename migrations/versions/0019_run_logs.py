"""job logs

Revision ID: 0019
Revises: 0018
Create Date: 2026-12-05 13:00:00

A job's log (its stderr, and a script's stdout) reaches the server in pieces with the
worker's heartbeats, so the run page shows it while the run trains: `run_log_chunks`, one
row a piece, keyed by run, attempt and the piece's offset in that attempt's log.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0019"
down_revision = "0018"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "run_log_chunks",
        sa.Column("run_id", sa.Integer(), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("offset", sa.BigInteger(), nullable=False),
        sa.Column("text", sa.Text(), nullable=False),
        sa.Column("size", sa.Integer(), nullable=False),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], name="fk_run_log_chunks_run_id"),
        sa.PrimaryKeyConstraint("run_id", "attempt", "offset", name="pk_run_log_chunks"),
    )


def downgrade() -> None:
    op.drop_table("run_log_chunks")
