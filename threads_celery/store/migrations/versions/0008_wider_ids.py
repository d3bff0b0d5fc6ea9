"""Thread and run ids up to 255 characters: room for a tenant's scoped id (``<tenant>~<id>``).

A caller-chosen id of a tenant other than ``default`` is stored scoped by the HTTP API
(:mod:`threads_celery.api.tenancy`): up to 128 characters of tenant, the ``~`` and 64 of id.
On PostgreSQL widening a VARCHAR is a change of the catalogue only (no table rewrite, the
indexes and foreign keys stay). SQLite does not enforce a VARCHAR's length, and changing the
declared one would mean rebuilding every table under ``PRAGMA foreign_keys=ON`` (a dropped
``threads`` would cascade its rows away), so its tables keep the ``VARCHAR(64)`` they have and
the schema declares that for SQLite (``schema.Id``).

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-02 12:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None

ID_COLUMNS = {
    "threads": ("id", "parent_thread_id", "active_run_id"),
    "runs": ("id", "thread_id"),
    "messages": ("thread_id", "run_id"),
    "events": ("thread_id", "run_id"),
    "tool_calls": ("run_id", "thread_id"),
    "agent_tool_runs": ("parent_thread_id", "parent_run_id", "child_thread_id", "child_run_id"),
    "variables": ("thread_id",),
    "model_usage": ("run_id", "thread_id"),
    "permission_grants": ("thread_id",),
}


def _retype(old: int, new: int) -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    for table, columns in ID_COLUMNS.items():
        for column in columns:
            op.alter_column(table, column, type_=sa.String(new), existing_type=sa.String(old))


def upgrade() -> None:
    _retype(64, 255)


def downgrade() -> None:
    # Fails, as it should, while a stored id is longer than 64 characters.
    _retype(255, 64)
