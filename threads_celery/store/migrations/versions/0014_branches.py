"""Branches of a thread's history: messages.superseded_by, threads.branch and the branches table
(rewind, regenerate, edit and fork keep what they leave behind, marked, instead of deleting it).

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-07 12:10:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None

_ID = sa.String(255).with_variant(sa.String(64), "sqlite")


def upgrade() -> None:
    op.create_table(
        "branches",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), autoincrement=True, nullable=False),
        sa.Column("thread_id", _ID, nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("from_seq", sa.Integer(), nullable=True),
        sa.Column("source_thread_id", _ID, nullable=True),
        sa.Column("source_seq", sa.Integer(), nullable=True),
        sa.Column("prior_effects", sa.JSON(), nullable=False),
        sa.Column("dropped_calls", sa.JSON(), nullable=False),
        sa.Column("inherit_grants", sa.Boolean(), nullable=False),
        sa.Column("created_by", sa.String(255), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["thread_id"], ["threads.id"], name=op.f("fk_branches_thread_id_threads"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_branches")),
    )
    op.create_index(op.f("ix_branches_thread_id_id"), "branches", ["thread_id", "id"])
    # Nullable, no default: PostgreSQL adds them without rewriting the tables.
    with op.batch_alter_table("threads", schema=None) as batch_op:
        batch_op.add_column(sa.Column("branch", sa.BigInteger(), nullable=True))
    with op.batch_alter_table("messages", schema=None) as batch_op:
        batch_op.add_column(sa.Column("superseded_by", sa.BigInteger(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("messages", schema=None) as batch_op:
        batch_op.drop_column("superseded_by")
    with op.batch_alter_table("threads", schema=None) as batch_op:
        batch_op.drop_column("branch")
    op.drop_index(op.f("ix_branches_thread_id_id"), table_name="branches")
    op.drop_table("branches")
