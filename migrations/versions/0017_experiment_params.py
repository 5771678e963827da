"""experiment parameters for search

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-05 09:00:00

Every leaf field of an experiment's spec, one row each in `experiment_params` (numbers in
`num`, other values as `text`), so the runs list searches by parameter on an index
(`params.training.optimizer.params.learning_rate = 0.003`). Existing experiments get their
rows here, read from their specs a batch at a time.
"""

from __future__ import annotations

import json
from typing import Any

import sqlalchemy as sa
from alembic import op

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None

_BATCH = 500


def upgrade() -> None:
    params = op.create_table(
        "experiment_params",
        sa.Column("experiment_id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column("num", sa.Float(), nullable=True),
        sa.Column("text", sa.String(200), nullable=True),
        sa.ForeignKeyConstraint(
            ["experiment_id"], ["experiments.id"], name="fk_experiment_params_experiment_id"
        ),
        sa.PrimaryKeyConstraint("experiment_id", "name", name="pk_experiment_params"),
    )
    op.create_index(
        "ix_experiment_params_name_num", "experiment_params", ["name", "num", "experiment_id"]
    )
    op.create_index(
        "ix_experiment_params_name_text", "experiment_params", ["name", "text", "experiment_id"]
    )
    from service.runs.params import param_rows

    bind = op.get_bind()
    experiments = sa.table("experiments", sa.column("id", sa.Integer), sa.column("spec", sa.JSON))
    last = 0
    while True:
        batch = bind.execute(
            sa.select(experiments.c.id, experiments.c.spec)
            .where(experiments.c.id > last)
            .order_by(experiments.c.id)
            .limit(_BATCH)
        ).all()
        if not batch:
            return
        rows: list[dict[str, Any]] = []
        for experiment_id, spec in batch:
            spec = json.loads(spec) if isinstance(spec, str) else spec
            rows += [
                {"experiment_id": r.experiment_id, "name": r.name, "num": r.num, "text": r.text}
                for r in param_rows(experiment_id, spec or {})
            ]
        if rows:
            bind.execute(params.insert(), rows)
        last = batch[-1][0]


def downgrade() -> None:
    op.drop_index("ix_experiment_params_name_text", table_name="experiment_params")
    op.drop_index("ix_experiment_params_name_num", table_name="experiment_params")
    op.drop_table("experiment_params")
