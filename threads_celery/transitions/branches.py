"""Branching a thread's history: rewind (and regenerate, edit) in place, fork onto a new thread.

A branch is never a replay. The messages a branch keeps are the ones the ledger holds, tool
results included, so no call before the branch point runs again; what it leaves behind stays in
the ledger, marked ``superseded_by`` the branch (in place) or untouched in its own thread (a
fork). Each function is one piece of a transaction, like the run transitions:

- a call that had no result at the point (pending, awaiting approval, parked, running) is not
  carried over as pending (:func:`~threads_celery.decisions.branches.cut_history`);
- a call the new branch makes is a new call of a new run, with its own effect key: an
  idempotent tool called again on a branch is a new effect;
- approvals are the calls' own and stay behind; remembered grants ("always allow") are copied to
  a fork only when asked;
- an ``unguarded`` or ``reconcilable`` call of the history left behind that ran (or may have) is
  a prior effect of the branch: a call of its tool on the branch waits for a person's approval
  (:func:`prior_effects_meta`, checked by :mod:`threads_celery.runtime.permission_checks`).

Branching in place needs the thread idle (:class:`~threads_celery.exceptions.ThreadBusy`
otherwise): a run in flight keeps the history it is writing. A fork reads its source as it is
and leaves it alone, so it may be taken from a thread that is running.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from threads_celery.decisions.branches import BadBranchPoint, Cut, cut_history, effect_keys_of, prior_effects
from threads_celery.exceptions import BranchPointNotFound, ConfigError, ThreadBusy, ThreadNotFound
from threads_celery.records import Branch, BranchKind, Message, PriorEffect, Thread
from threads_celery.store import Tx

#: The key of a run's ``input_meta`` that carries its branch's prior effects.
PRIOR_EFFECTS_KEY = "prior_effects"


def _cut(tx: Tx, thread_id: str, at: int | None) -> tuple[list[Message], Cut]:
    history = tx.list_messages(thread_id)
    try:
        return history, cut_history(history, at)
    except BadBranchPoint:
        assert at is not None
        raise BranchPointNotFound(thread_id, at) from None


def _inherited(tx: Tx, thread: Thread) -> tuple[PriorEffect, ...]:
    """The prior effects of the thread's current branch: still effects a new branch must not repeat."""
    if thread.branch is None:
        return ()
    current = tx.get_branch(thread.branch)
    return current.prior_effects if current is not None else ()


def _merged(*groups: tuple[PriorEffect, ...]) -> tuple[PriorEffect, ...]:
    seen: dict[str, PriorEffect] = {}
    for group in groups:
        for effect in group:
            seen.setdefault(effect.effect_key, effect)
    return tuple(seen.values())


def _write(tx: Tx, thread_id: str, message: Message, now: datetime, *, keep_key: bool) -> None:
    tx.insert_message(
        thread_id=thread_id,
        run_id=message.run_id,
        role=message.role,
        text=message.text,
        now=now,
        tool_calls=message.tool_calls,
        tool_result=message.tool_result,
        meta=message.meta,
        # In place, the superseded original keeps its key (a key names one message per thread).
        key=message.key if keep_key else None,
    )


def branch_event(branch: Branch) -> dict[str, Any]:
    """The payload of a thread's ``branch`` event: a reader reloads the history it shows."""
    return {
        "branch": branch.id,
        "kind": branch.kind,
        "from_seq": branch.from_seq,
        "source_thread_id": branch.source_thread_id,
        "source_seq": branch.source_seq,
        "dropped_calls": list(branch.dropped_calls),
        "prior_effects": [p.effect_key for p in branch.prior_effects],
    }


def rewind(
    tx: Tx,
    thread_id: str,
    *,
    at: int | None,
    now: datetime,
    kind: BranchKind = "rewind",
    by: str | None = None,
) -> Branch | None:
    """Branch the thread in place after message ``at`` (None: before its first message).

    The messages after the point are superseded, not deleted; the thread goes on from the point
    with its next run. None (nothing written) when nothing follows the point. ``ThreadBusy``
    while a run of the thread is not finished.
    """
    thread = tx.get_thread(thread_id, lock=True)
    if thread is None:
        raise ThreadNotFound(thread_id)
    if thread.active_run_id is not None:
        raise ThreadBusy(thread_id, thread.active_run_id)
    _, cut = _cut(tx, thread_id, at)
    first_left = cut.first_left
    if first_left is None:
        return None
    found = prior_effects(tx.calls_by_keys(effect_keys_of(cut.left_behind)))
    effects = _merged(_inherited(tx, thread), found)
    branch_id = tx.insert_branch(
        thread_id, kind, now, from_seq=first_left, prior_effects=effects, dropped_calls=cut.dropped, created_by=by
    )
    tx.supersede_messages(thread_id, first_left, branch_id)
    for message in cut.rewritten:
        _write(tx, thread_id, message, now, keep_key=False)
    branch = tx.get_branch(branch_id)
    assert branch is not None
    tx.append_event(thread_id, None, "branch", branch_event(branch), now)
    return branch


def fork(
    tx: Tx,
    source_thread_id: str,
    *,
    at: int | None,
    new_thread_id: str,
    now: datetime,
    by: str | None = None,
    inherit_grants: bool = False,
) -> Branch:
    """A new thread whose history is a copy of the source's through message ``at``.

    The source is read and left as it is. The copy keeps the source's agent, configuration and
    tenant, and its variables (secrets stay sealed); the remembered grants only with
    ``inherit_grants``.
    """
    source = tx.get_thread(source_thread_id)
    if source is None:
        raise ThreadNotFound(source_thread_id)
    if tx.get_thread(new_thread_id) is not None:
        raise ConfigError(f"thread {new_thread_id!r} exists already; a fork starts a new thread")
    _, cut = _cut(tx, source_thread_id, at)
    found = prior_effects(tx.calls_by_keys(effect_keys_of(cut.left_behind)))
    effects = _merged(_inherited(tx, source), found)
    tx.insert_thread(new_thread_id, source.agent, source.config_hash, now, tenant=source.tenant)
    for message in (*cut.kept, *cut.rewritten):
        _write(tx, new_thread_id, message, now, keep_key=True)
    for name, (kind, value) in tx.thread_variables(source_thread_id).items():
        tx.set_variable(new_thread_id, name, kind, value, now)
    if inherit_grants:
        for grant in tx.list_grants(source_thread_id):
            tx.grant_tool(new_thread_id, grant.tool, granted_by=grant.granted_by, now=now)
    branch_id = tx.insert_branch(
        new_thread_id,
        "fork",
        now,
        source_thread_id=source_thread_id,
        source_seq=at,
        prior_effects=effects,
        dropped_calls=cut.dropped,
        inherit_grants=inherit_grants,
        created_by=by,
    )
    branch = tx.get_branch(branch_id)
    assert branch is not None
    tx.append_event(new_thread_id, None, "branch", branch_event(branch), now)
    return branch


def prior_effects_meta(tx: Tx, thread: Thread) -> list[dict[str, str]] | None:
    """What a run starting on ``thread`` carries of its branch's prior effects (None: none)."""
    effects = _inherited(tx, thread)
    return [p.to_json() for p in effects] or None


__all__ = ["PRIOR_EFFECTS_KEY", "branch_event", "fork", "prior_effects_meta", "rewind"]
