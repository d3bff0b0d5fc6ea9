"""Deployment versions: runs.deploy_version (and its policy, pin reason and last check), the
deploy_versions, deploy_workers and deploy_marks tables.

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-07 12:30:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Nullable columns without a default: PostgreSQL adds them without rewriting the table.
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("deploy_version", sa.String(length=64), nullable=True))
        batch_op.add_column(sa.Column("deploy_policy", sa.String(length=16), nullable=True))
        batch_op.add_column(sa.Column("deploy_pin_reason", sa.Text(), nullable=True))
        batch_op.add_column(sa.Column("deploy_checked", sa.String(length=64), nullable=True))
        batch_op.create_index("ix_runs_deploy_version_status", ["deploy_version", "status"], unique=False)
    op.create_table(
        "deploy_versions",
        sa.Column("version", sa.String(length=64), nullable=False),
        sa.Column("role", sa.String(length=16), nullable=True),
        sa.Column("ramp_percent", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("agents", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("promoted_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("retired_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("version", name=op.f("pk_deploy_versions")),
    )
    op.create_table(
        "deploy_workers",
        sa.Column("worker", sa.String(length=255), nullable=False),
        sa.Column("version", sa.String(length=64), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("seen_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("worker", name=op.f("pk_deploy_workers")),
    )
    op.create_index("ix_deploy_workers_version", "deploy_workers", ["version"], unique=False)
    op.create_table(
        "deploy_marks",
        sa.Column("key", sa.String(length=255), nullable=False),
        sa.Column("run_id", sa.String(length=255).with_variant(sa.String(length=64), "sqlite"), nullable=False),
        sa.Column("version", sa.String(length=64), nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("key", name=op.f("pk_deploy_marks")),
    )
    op.create_index("ix_deploy_marks_run_id", "deploy_marks", ["run_id"], unique=False)


def downgrade() -> None:
    op.drop_index("ix_deploy_marks_run_id", table_name="deploy_marks")
    op.drop_table("deploy_marks")
    op.drop_index("ix_deploy_workers_version", table_name="deploy_workers")
    op.drop_table("deploy_workers")
    op.drop_table("deploy_versions")
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.drop_index("ix_runs_deploy_version_status")
        batch_op.drop_column("deploy_checked")
        batch_op.drop_column("deploy_pin_reason")
        batch_op.drop_column("deploy_policy")
        batch_op.drop_column("deploy_version")
