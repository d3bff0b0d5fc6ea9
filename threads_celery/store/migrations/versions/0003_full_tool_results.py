"""Whole tool results: tool_calls.full_result keeps a result the model was shown shortened.

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-01 00:40:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0003'
down_revision = '0002'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('tool_calls', schema=None) as batch_op:
        batch_op.add_column(sa.Column('full_result', sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('tool_calls', schema=None) as batch_op:
        batch_op.drop_column('full_result')
