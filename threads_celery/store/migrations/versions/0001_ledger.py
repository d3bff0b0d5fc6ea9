"""The ledger: agents, threads, messages, events, runs, tool calls, the outbox, agent-tool runs and milestones.

Revision ID: 0001
Revises:
Create Date: 2026-11-29 15:05:00.759702
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op



revision = '0001'
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('agents',
    sa.Column('name', sa.String(length=128), nullable=False),
    sa.Column('config_hash', sa.String(length=64), nullable=False),
    sa.Column('description', sa.JSON(), nullable=False),
    sa.Column('updated_at', sa.DateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint('name', name=op.f('pk_agents'))
    )
    op.create_table('outbox',
    sa.Column('key', sa.String(length=255), nullable=False),
    sa.Column('task', sa.String(length=128), nullable=False),
    sa.Column('args', sa.JSON(), nullable=False),
    sa.Column('queue', sa.String(length=255), nullable=True),
    sa.Column('argsrepr', sa.String(length=512), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('due_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('publish_count', sa.Integer(), nullable=False),
    sa.PrimaryKeyConstraint('key', name=op.f('pk_outbox'))
    )
    with op.batch_alter_table('outbox', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_outbox_due_at'), ['due_at'], unique=False)

    op.create_table('threads',
    sa.Column('id', sa.String(length=64), nullable=False),
    sa.Column('agent', sa.String(length=128), nullable=False),
    sa.Column('config_hash', sa.String(length=64), nullable=False),
    sa.Column('parent_thread_id', sa.String(length=64), nullable=True),
    sa.Column('active_run_id', sa.String(length=64), nullable=True),
    sa.Column('event_seq', sa.BigInteger(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['parent_thread_id'], ['threads.id'], name=op.f('fk_threads_parent_thread_id_threads'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_threads'))
    )
    with op.batch_alter_table('threads', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_threads_parent_thread_id'), ['parent_thread_id'], unique=False)

    op.create_table('agent_tool_runs',
    sa.Column('run_id', sa.String(length=255), nullable=False),
    sa.Column('parent_thread_id', sa.String(length=64), nullable=False),
    sa.Column('parent_run_id', sa.String(length=64), nullable=True),
    sa.Column('parent_tool_call_id', sa.String(length=255), nullable=True),
    sa.Column('parent_effect_key', sa.String(length=255), nullable=True),
    sa.Column('agent_type', sa.String(length=128), nullable=False),
    sa.Column('display_order', sa.Integer(), nullable=False),
    sa.Column('display_name', sa.String(length=255), nullable=True),
    sa.Column('child_thread_id', sa.String(length=64), nullable=True),
    sa.Column('child_run_id', sa.String(length=64), nullable=True),
    sa.Column('input', sa.JSON(), nullable=True),
    sa.Column('input_preview', sa.Text(), nullable=False),
    sa.Column('status', sa.String(length=32), nullable=False),
    sa.Column('reason', sa.String(length=64), nullable=True),
    sa.Column('child_still_running', sa.Boolean(), nullable=True),
    sa.Column('error', sa.Text(), nullable=True),
    sa.Column('summary', sa.Text(), nullable=True),
    sa.Column('output', sa.JSON(), nullable=True),
    sa.Column('progress', sa.JSON(), nullable=True),
    sa.Column('last_signal_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('detached', sa.Boolean(), nullable=False),
    sa.Column('event_delivery', sa.String(length=16), nullable=False),
    sa.Column('on_finish', sa.String(length=255), nullable=True),
    sa.Column('notify', sa.JSON(), nullable=True),
    sa.Column('on_milestones', sa.JSON(), nullable=True),
    sa.Column('max_budget_ms', sa.BigInteger(), nullable=True),
    sa.Column('no_progress_budget_ms', sa.BigInteger(), nullable=True),
    sa.Column('check_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('delivered', sa.JSON(), nullable=False),
    sa.Column('delivery_owner', sa.String(length=255), nullable=True),
    sa.Column('delivery_lease_until', sa.DateTime(timezone=True), nullable=True),
    sa.Column('delivery_attempts', sa.Integer(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('started_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('finished_at', sa.DateTime(timezone=True), nullable=True),
    sa.ForeignKeyConstraint(['parent_thread_id'], ['threads.id'], name=op.f('fk_agent_tool_runs_parent_thread_id_threads'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('run_id', name=op.f('pk_agent_tool_runs')),
    sa.UniqueConstraint('child_run_id', name=op.f('uq_agent_tool_runs_child_run_id'))
    )
    with op.batch_alter_table('agent_tool_runs', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_agent_tool_runs_check_at'), ['check_at'], unique=False)
        batch_op.create_index(batch_op.f('ix_agent_tool_runs_parent_thread_id_created_at'), ['parent_thread_id', 'created_at'], unique=False)

    op.create_table('events',
    sa.Column('id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), autoincrement=True, nullable=False),
    sa.Column('thread_id', sa.String(length=64), nullable=False),
    sa.Column('seq', sa.BigInteger(), nullable=False),
    sa.Column('run_id', sa.String(length=64), nullable=True),
    sa.Column('type', sa.String(length=64), nullable=False),
    sa.Column('payload', sa.JSON(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['thread_id'], ['threads.id'], name=op.f('fk_events_thread_id_threads'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_events')),
    sa.UniqueConstraint('thread_id', 'seq', name=op.f('uq_events_thread_id_seq'))
    )
    op.create_table('messages',
    sa.Column('id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), autoincrement=True, nullable=False),
    sa.Column('thread_id', sa.String(length=64), nullable=False),
    sa.Column('seq', sa.Integer(), nullable=False),
    sa.Column('run_id', sa.String(length=64), nullable=True),
    sa.Column('role', sa.String(length=16), nullable=False),
    sa.Column('text', sa.Text(), nullable=False),
    sa.Column('parts', sa.JSON(), nullable=True),
    sa.Column('meta', sa.JSON(), nullable=True),
    sa.Column('key', sa.String(length=255), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['thread_id'], ['threads.id'], name=op.f('fk_messages_thread_id_threads'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_messages')),
    sa.UniqueConstraint('thread_id', 'key', name=op.f('uq_messages_thread_id_key')),
    sa.UniqueConstraint('thread_id', 'seq', name=op.f('uq_messages_thread_id_seq'))
    )
    op.create_table('runs',
    sa.Column('id', sa.String(length=64), nullable=False),
    sa.Column('thread_id', sa.String(length=64), nullable=False),
    sa.Column('agent', sa.String(length=128), nullable=False),
    sa.Column('status', sa.String(length=32), nullable=False),
    sa.Column('input', sa.Text(), nullable=False),
    sa.Column('input_meta', sa.JSON(), nullable=True),
    sa.Column('agent_tool_run_id', sa.String(length=255), nullable=True),
    sa.Column('step', sa.Integer(), nullable=False),
    sa.Column('fence', sa.BigInteger(), nullable=False),
    sa.Column('lease_owner', sa.String(length=255), nullable=True),
    sa.Column('lease_expires_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('output', sa.Text(), nullable=True),
    sa.Column('error', sa.Text(), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('started_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('finished_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('updated_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['thread_id'], ['threads.id'], name=op.f('fk_runs_thread_id_threads'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_runs'))
    )
    with op.batch_alter_table('runs', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_runs_status_lease_expires_at'), ['status', 'lease_expires_at'], unique=False)
        batch_op.create_index(batch_op.f('ix_runs_thread_id_created_at'), ['thread_id', 'created_at'], unique=False)

    op.create_table('variables',
    sa.Column('thread_id', sa.String(length=64), nullable=False),
    sa.Column('name', sa.String(length=128), nullable=False),
    sa.Column('type', sa.String(length=16), nullable=False),
    sa.Column('value', sa.Text(), nullable=False),
    sa.Column('updated_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['thread_id'], ['threads.id'], name=op.f('fk_variables_thread_id_threads'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('thread_id', 'name', name=op.f('pk_variables'))
    )
    op.create_table('milestones',
    sa.Column('id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), autoincrement=True, nullable=False),
    sa.Column('agent_tool_run_id', sa.String(length=255), nullable=False),
    sa.Column('sequence', sa.Integer(), nullable=False),
    sa.Column('name', sa.String(length=255), nullable=False),
    sa.Column('data', sa.JSON(), nullable=True),
    sa.Column('at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['agent_tool_run_id'], ['agent_tool_runs.run_id'], name=op.f('fk_milestones_agent_tool_run_id_agent_tool_runs'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_milestones')),
    sa.UniqueConstraint('agent_tool_run_id', 'sequence', name=op.f('uq_milestones_agent_tool_run_id_sequence'))
    )
    op.create_table('tool_calls',
    sa.Column('effect_key', sa.String(length=255), nullable=False),
    sa.Column('run_id', sa.String(length=64), nullable=False),
    sa.Column('thread_id', sa.String(length=64), nullable=False),
    sa.Column('step', sa.Integer(), nullable=False),
    sa.Column('idx', sa.Integer(), nullable=False),
    sa.Column('calls_in_step', sa.Integer(), nullable=False),
    sa.Column('call_id', sa.String(length=255), nullable=False),
    sa.Column('tool', sa.String(length=255), nullable=False),
    sa.Column('args', sa.Text(), nullable=False),
    sa.Column('args_hash', sa.String(length=64), nullable=False),
    sa.Column('effect', sa.String(length=32), nullable=False),
    sa.Column('dedup_window_ms', sa.BigInteger(), nullable=True),
    sa.Column('finality', sa.String(length=16), nullable=True),
    sa.Column('queue', sa.String(length=255), nullable=True),
    sa.Column('status', sa.String(length=32), nullable=False),
    sa.Column('attempt', sa.Integer(), nullable=False),
    sa.Column('first_started_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('lease_owner', sa.String(length=255), nullable=True),
    sa.Column('lease_expires_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('result', sa.Text(), nullable=True),
    sa.Column('is_error', sa.Boolean(), nullable=False),
    sa.Column('park_reason', sa.Text(), nullable=True),
    sa.Column('resolution', sa.String(length=32), nullable=True),
    sa.Column('resolved_by', sa.String(length=255), nullable=True),
    sa.Column('resolved_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('approved_by', sa.String(length=255), nullable=True),
    sa.Column('approved_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('approved_args_hash', sa.String(length=64), nullable=True),
    sa.Column('original_args', sa.Text(), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('finished_at', sa.DateTime(timezone=True), nullable=True),
    sa.ForeignKeyConstraint(['run_id'], ['runs.id'], name=op.f('fk_tool_calls_run_id_runs'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('effect_key', name=op.f('pk_tool_calls')),
    sa.UniqueConstraint('run_id', 'step', 'idx', name=op.f('uq_tool_calls_run_id_step_idx'))
    )
    with op.batch_alter_table('tool_calls', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_tool_calls_status_lease_expires_at'), ['status', 'lease_expires_at'], unique=False)



def downgrade() -> None:
    with op.batch_alter_table('tool_calls', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_tool_calls_status_lease_expires_at'))

    op.drop_table('tool_calls')
    op.drop_table('milestones')
    op.drop_table('variables')
    with op.batch_alter_table('runs', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_runs_thread_id_created_at'))
        batch_op.drop_index(batch_op.f('ix_runs_status_lease_expires_at'))

    op.drop_table('runs')
    op.drop_table('messages')
    op.drop_table('events')
    with op.batch_alter_table('agent_tool_runs', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_agent_tool_runs_parent_thread_id_created_at'))
        batch_op.drop_index(batch_op.f('ix_agent_tool_runs_check_at'))

    op.drop_table('agent_tool_runs')
    with op.batch_alter_table('threads', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_threads_parent_thread_id'))

    op.drop_table('threads')
    with op.batch_alter_table('outbox', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_outbox_due_at'))

    op.drop_table('outbox')
    op.drop_table('agents')
