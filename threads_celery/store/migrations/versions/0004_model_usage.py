"""Model usage: one row per committed model step (requests, tokens, cost).

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-01 00:40:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "model_usage",
        sa.Column("run_id", sa.String(64), nullable=False),
        sa.Column("step", sa.Integer(), nullable=False),
        sa.Column("thread_id", sa.String(64), nullable=False),
        sa.Column("agent", sa.String(128), nullable=False),
        sa.Column("model", sa.String(255), nullable=False),
        sa.Column("requests", sa.Integer(), nullable=False),
        sa.Column("input_tokens", sa.BigInteger(), nullable=False),
        sa.Column("output_tokens", sa.BigInteger(), nullable=False),
        sa.Column("cost", sa.Float(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("run_id", "step", name=op.f("pk_model_usage")),
    )
    op.create_index(op.f("ix_model_usage_thread_id"), "model_usage", ["thread_id"])
    op.create_index(op.f("ix_model_usage_agent_created_at"), "model_usage", ["agent", "created_at"])


def downgrade() -> None:
    op.drop_index(op.f("ix_model_usage_agent_created_at"), table_name="model_usage")
    op.drop_index(op.f("ix_model_usage_thread_id"), table_name="model_usage")
    op.drop_table("model_usage")
