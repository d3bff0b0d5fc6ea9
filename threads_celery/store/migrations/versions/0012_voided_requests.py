"""runs.voided_step, runs.voided_requests: the attempts of a model step that were voided after
they may have reached the provider, which the step's usage counts.

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-07 01:20:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # A constant default: PostgreSQL 11+ adds these without rewriting the table.
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("voided_step", sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column("voided_requests", sa.Integer(), nullable=False, server_default="0"))


def downgrade() -> None:
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.drop_column("voided_requests")
        batch_op.drop_column("voided_step")
