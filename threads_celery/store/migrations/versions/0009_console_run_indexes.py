"""Indexes for the operations console's run list: newest first, by agent or by status.

Without them PostgreSQL reads and sorts every run of the table to show a page of 50 of them
(``ORDER BY created_at DESC, id DESC LIMIT 50``), with or without an agent or status filter.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-03 18:00:00
"""

from __future__ import annotations

from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_runs_created_at_id", "runs", ["created_at", "id"], unique=False)
    op.create_index("ix_runs_agent_created_at", "runs", ["agent", "created_at"], unique=False)
    op.create_index("ix_runs_status_created_at", "runs", ["status", "created_at"], unique=False)


def downgrade() -> None:
    op.drop_index("ix_runs_status_created_at", table_name="runs")
    op.drop_index("ix_runs_agent_created_at", table_name="runs")
    op.drop_index("ix_runs_created_at_id", table_name="runs")
