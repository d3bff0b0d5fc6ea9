"""Remembered permission decisions: "always allow this tool on this thread".

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-01 00:40:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0005'
down_revision = '0004'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('permission_grants',
    sa.Column('thread_id', sa.String(length=64), nullable=False),
    sa.Column('tool', sa.String(length=255), nullable=False),
    sa.Column('granted_by', sa.String(length=255), nullable=False),
    sa.Column('granted_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['thread_id'], ['threads.id'], name=op.f('fk_permission_grants_thread_id_threads'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('thread_id', 'tool', name=op.f('pk_permission_grants'))
    )


def downgrade() -> None:
    op.drop_table('permission_grants')
