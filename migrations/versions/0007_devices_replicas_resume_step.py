"""worker devices, run replicas, the step a run resumed from

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-23 22:30:00

Workers advertise their devices: `gpus` (counted by the node through the CUDA driver) and,
for CPU-only workers, `cpu_devices` (logical CPU devices the operator lets a job create);
`devices` is what a claim compares a run's replicas with (the GPUs, else the CPU devices).
Workers registered before this revision offer one device. `runs.replicas` is copied from
the spec's `distribution.replicas` at submit (1 for every older run, whose specs have no
replicas). `runs.resumed_from_step` is the global step of the checkpoint a run's last
attempt started from.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("workers", schema=None) as batch_op:
        batch_op.add_column(sa.Column("gpus", sa.Integer(), server_default="0", nullable=False))
        batch_op.add_column(sa.Column("cpu_devices", sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column("devices", sa.Integer(), server_default="1", nullable=False))
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("replicas", sa.Integer(), server_default="1", nullable=False))
        batch_op.add_column(sa.Column("resumed_from_step", sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.drop_column("resumed_from_step")
        batch_op.drop_column("replicas")
    with op.batch_alter_table("workers", schema=None) as batch_op:
        batch_op.drop_column("devices")
        batch_op.drop_column("cpu_devices")
        batch_op.drop_column("gpus")
