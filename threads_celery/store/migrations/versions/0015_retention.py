"""Retention: ``retention_holds`` (a thread that retention must keep) and ``threads(created_at,
id)``, the range the sweep walks oldest first in bounded batches.

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-07 12:30:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "retention_holds",
        sa.Column("thread_id", sa.String(255).with_variant(sa.String(64), "sqlite"), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("held_by", sa.String(255), nullable=False),
        sa.Column("held_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["thread_id"], ["threads.id"], name="fk_retention_holds_thread_id_threads", ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("thread_id", name="pk_retention_holds"),
    )
    op.create_index("ix_threads_created_at_id", "threads", ["created_at", "id"], unique=False)


def downgrade() -> None:
    op.drop_index("ix_threads_created_at_id", table_name="threads")
    op.drop_table("retention_holds")
