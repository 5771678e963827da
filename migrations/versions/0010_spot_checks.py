"""spot checks: replays of a few segments of a finished run

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-29 09:00:00

A spot check replays K randomly chosen segments of a run (between consecutive kept
checkpoints) as runs of kind `spot-check`, preferably on another worker, and compares each
segment's end with the recorded checkpoint bit for bit. `spot_checks` keeps the request
(the seed that chose the segments, so the choice can be reproduced), the segments and the
outcome; `runs.spot_check` keeps the newest outcome of a run for the runs list's filter;
`runs.avoid_worker` names the worker a replay should not run on while another could.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "spot_checks",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("run_id", sa.Integer(), nullable=False),
        sa.Column("seed", sa.BigInteger(), nullable=False),
        sa.Column("requested", sa.Integer(), nullable=False),
        sa.Column("segments", sa.JSON(), nullable=False),
        sa.Column("status", sa.String(length=20), nullable=False),
        sa.Column("report", sa.JSON(), nullable=True),
        sa.Column("requested_by", sa.String(length=200), nullable=True),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("finished_at", sa.DateTime(), nullable=True),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], name="fk_spot_checks_run_id"),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_spot_checks_run_id", "spot_checks", ["run_id"], unique=False)
    with op.batch_alter_table("runs") as batch:
        batch.add_column(sa.Column("spot_check", sa.String(length=20), nullable=True))
        batch.add_column(sa.Column("avoid_worker", sa.String(length=200), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("avoid_worker")
        batch.drop_column("spot_check")
    op.drop_index("ix_spot_checks_run_id", table_name="spot_checks")
    op.drop_table("spot_checks")
