"""fair claims across submitters, and priorities

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-04 15:00:00

Claims go to the submitter served least recently (`api_tokens.queue_turn_at`, set when a
worker claims one of the token's runs), within the highest `runs.priority` (0 unless an
admin set it). `runs.submitter_id` is the token that queued the run; null for runs queued
before this revision and runs the server queues itself, which count as one submitter that
was never served.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from migrations.schema_ops import add_reference_column

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    add_reference_column("runs", "submitter_id", "api_tokens", "fk_runs_submitter_id")
    op.add_column("runs", sa.Column("priority", sa.Integer(), nullable=False, server_default="0"))
    op.add_column("api_tokens", sa.Column("queue_turn_at", sa.DateTime(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("api_tokens") as batch:
        batch.drop_column("queue_turn_at")
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("priority")
        batch.drop_column("submitter_id")
