"""PostgreSQL: the columns that hold prompts, replies, tool results and event payloads compress
their large values with LZ4 instead of pglz.

A value over about 2 kB is compressed when it is written (TOAST), and pglz is slow at it: a
tool call whose result is 100 kB writes it five times (the call's result, the message's text and
parts, the event's payload twice), and its commit took 20 ms here, of which most was pglz; with
LZ4 it took 7 ms. Reads decompress faster too. Only how new values are compressed changes: the
values already stored stay as they are, and small values are not compressed either way.

Applied where the server can (PostgreSQL 14 or later, built with LZ4, as the common packages
are); elsewhere, and on SQLite, nothing changes.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-04 23:00:00
"""

from __future__ import annotations

from alembic import op
from sqlalchemy import text

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None

#: The columns whose values grow with what models, tools and people write.
WIDE_COLUMNS = {
    "messages": ("text", "parts", "meta"),
    "events": ("payload",),
    "tool_calls": ("args", "result", "original_args", "full_result"),
    "runs": ("input", "input_meta", "output", "error"),
    "agent_tool_runs": ("input", "output", "error", "summary", "progress"),
    "milestones": ("data",),
    "outbox": ("args",),
}


def _lz4_available() -> bool:
    bind = op.get_bind()
    if bind.dialect.name != "postgresql":
        return False
    found = bind.execute(
        text("SELECT 'lz4' = ANY(enumvals) FROM pg_settings WHERE name = 'default_toast_compression'")
    ).scalar()
    return bool(found)


def _set_compression(method: str) -> None:
    for table, columns in WIDE_COLUMNS.items():
        changes = ", ".join(f'ALTER COLUMN "{column}" SET COMPRESSION {method}' for column in columns)
        op.execute(f'ALTER TABLE "{table}" {changes}')


def upgrade() -> None:
    if _lz4_available():
        _set_compression("lz4")


def downgrade() -> None:
    if _lz4_available():
        _set_compression("default")
