"""Thread ownership for the HTTP API: threads.tenant (existing threads belong to "default").

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-01 01:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0007'
down_revision = '0006'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('threads', schema=None) as batch_op:
        batch_op.add_column(sa.Column('tenant', sa.String(length=128), server_default='default', nullable=False))
        batch_op.create_index(batch_op.f('ix_threads_tenant'), ['tenant'], unique=False)


def downgrade() -> None:
    with op.batch_alter_table('threads', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_threads_tenant'))
        batch_op.drop_column('tenant')
