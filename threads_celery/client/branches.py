"""Branches of a thread's history: rewind, fork, regenerate and edit, and the branches a thread
has had. A mixin of :class:`~threads_celery.client.threads.Threads`; the rules are
:mod:`threads_celery.transitions.branches`'.
"""

from __future__ import annotations

from collections.abc import Sequence
from types import EllipsisType
from typing import TYPE_CHECKING, Any

from threads_celery.exceptions import PayloadTooLarge, RunNotFound, ThreadNotFound, UnknownAgent
from threads_celery.records import Branch, BranchKind, Message, OutboxEntry, RunHandle
from threads_celery.store.storable import unstorable_reason
from threads_celery.transitions import branches, runs

if TYPE_CHECKING:
    from threads_celery.settings import Settings
    from threads_celery.store import Store, Tx
    from threads_celery.transitions.publishing import Publisher


class BranchesMixin:
    """Rewind, fork, regenerate and edit (a mixin of :class:`~threads_celery.client.threads.Threads`)."""

    store: Store
    publisher: Publisher
    is_embedded: bool
    settings: Settings

    if TYPE_CHECKING:

        def start_worker(
            self, *, queues: Sequence[str] | None = None, reconcile_interval: float | EllipsisType | None = ...
        ) -> None: ...

    def branches(self, thread_id: str) -> list[Branch]:
        """The thread's branches, oldest first (empty for a thread never rewound or forked)."""
        with self.store.read() as tx:
            return tx.list_branches(thread_id)

    def rewind(self, thread_id: str, at: int | None, *, by: str | None = None) -> Branch | None:
        """Go on from message ``at`` (its ``seq``; None: from the start), in place.

        The messages after it are kept as a superseded branch (``messages(...,
        include_superseded=True)`` shows them), the model's input of the next run ends at
        ``at``, and calls that had no result there are dropped, never left pending. None when
        nothing follows ``at``. ``ThreadBusy`` while a run of the thread is not finished;
        ``BranchPointNotFound`` for a message not on the current branch.
        """
        with self.store.transaction() as tx:
            return branches.rewind(tx, thread_id, at=at, now=runs.utcnow(), by=by)

    def fork(
        self,
        thread_id: str,
        at: int | None,
        *,
        new_thread_id: str | None = None,
        inherit_grants: bool = False,
        by: str | None = None,
    ) -> Branch:
        """A new thread whose history is a copy of ``thread_id``'s through message ``at``.

        The source is left as it is (it may be running). Tool results are copied as results and
        never run again; calls pending at ``at`` are not copied; remembered grants only with
        ``inherit_grants``. The new thread's id is the returned branch's ``thread_id``.
        """
        with self.store.transaction() as tx:
            return branches.fork(
                tx,
                thread_id,
                at=at,
                new_thread_id=new_thread_id or runs.new_id("thread"),
                now=runs.utcnow(),
                by=by,
                inherit_grants=inherit_grants,
            )

    def regenerate(self, thread_id: str, run_id: str | None = None, *, by: str | None = None) -> RunHandle:
        """Answer a user message again: the run's reply (and all after it) becomes a superseded
        branch and a new run answers the same message. ``run_id``: the run whose reply to
        regenerate; by default the thread's latest run on its current branch."""
        return self._branch_and_start(thread_id, run_id, None, "regenerate", by=by)

    def edit(self, thread_id: str, run_id: str, text: str, *, by: str | None = None) -> RunHandle:
        """Replace the user message of ``run_id`` with ``text`` and answer it: the message and
        everything after it become a superseded branch."""
        return self._branch_and_start(thread_id, run_id, text, "edit", by=by)

    def _branch_and_start(
        self,
        thread_id: str,
        run_id: str | None,
        text: str | None,
        kind: BranchKind,
        *,
        by: str | None,
        input_meta: dict[str, Any] | None = None,
        new_run_id: str | None = None,
    ) -> RunHandle:
        """Rewind to just before a run's user message and start a run there, in one transaction."""
        if text is not None:
            if not isinstance(text, str):
                raise TypeError(f"text must be a str, not {type(text).__name__}")
            unstorable = unstorable_reason(text)
            if unstorable is not None:
                raise ValueError(f"text {unstorable}")
            if len(text.encode()) > self.settings.max_message_bytes:
                raise PayloadTooLarge(len(text.encode()), self.settings.max_message_bytes)
        if self.is_embedded:
            self.start_worker()
        else:
            self.publisher.ensure_reachable()
        entries: list[OutboxEntry]
        with self.store.transaction() as tx:
            user = _user_message(tx, thread_id, run_id)
            run = tx.get_run(user.run_id or "")
            if run is None:
                raise RunNotFound(user.run_id or "")
            config_hash = tx.agent_hash(run.agent)
            if config_hash is None:
                raise UnknownAgent(f"agent {run.agent!r} is not registered")
            previous = [m.seq for m in tx.list_messages(thread_id) if m.seq < user.seq]
            now = runs.utcnow()
            branches.rewind(tx, thread_id, at=previous[-1] if previous else None, now=now, kind=kind, by=by)
            started, entries = runs.submit_run(
                tx,
                agent=run.agent,
                config_hash=config_hash,
                message=user.text if text is None else text,
                now=now,
                thread_id=thread_id,
                run_id=new_run_id,
                input_meta=input_meta,
            )
        self.publisher(entries)
        return RunHandle(run_id=started.id, thread_id=started.thread_id, status=started.status)


def _user_message(tx: Tx, thread_id: str, run_id: str | None) -> Message:
    """The user message of ``run_id`` on the thread's current branch (the latest one by default)."""
    if tx.get_thread(thread_id) is None:
        raise ThreadNotFound(thread_id)
    users = [m for m in tx.list_messages(thread_id) if m.role == "user" and m.run_id is not None]
    if run_id is not None:
        users = [m for m in users if m.run_id == run_id]
    if not users:
        raise RunNotFound(run_id or "", f"no run of thread {thread_id!r} on its current branch has a user message")
    return users[-1]


__all__ = ["BranchesMixin"]
