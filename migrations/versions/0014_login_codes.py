"""one-time dashboard login codes in the database

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-04 18:00:00

A login code the embedded server prints was kept in the memory of the process that issued
it, so another API process behind the same address could not redeem it. The codes (their
SHA-256 only) now live here until used or expired.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "login_codes",
        sa.Column("code_hash", sa.String(64), primary_key=True),
        sa.Column(
            "token_id",
            sa.Integer(),
            sa.ForeignKey("api_tokens.id", ondelete="CASCADE"),
            nullable=False,
        ),
        sa.Column("expires_at", sa.DateTime(), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("login_codes")
