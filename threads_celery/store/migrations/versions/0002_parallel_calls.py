"""Concurrent tool-call groups: tool_calls.batch.

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-01 00:30:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0002'
down_revision = '0001'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('tool_calls', schema=None) as batch_op:
        batch_op.add_column(sa.Column('batch', sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('tool_calls', schema=None) as batch_op:
        batch_op.drop_column('batch')
