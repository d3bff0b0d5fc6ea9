"""runs.lost_step, runs.lost_times, tool_calls.lost_times: how often a worker process running a
step or a call was lost (killed, out of memory, past the hard time limit).

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-05 13:30:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # A constant default: PostgreSQL 11+ adds these without rewriting the tables.
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("lost_step", sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column("lost_times", sa.Integer(), nullable=False, server_default="0"))
    with op.batch_alter_table("tool_calls", schema=None) as batch_op:
        batch_op.add_column(sa.Column("lost_times", sa.Integer(), nullable=False, server_default="0"))


def downgrade() -> None:
    with op.batch_alter_table("tool_calls", schema=None) as batch_op:
        batch_op.drop_column("lost_times")
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.drop_column("lost_times")
        batch_op.drop_column("lost_step")
