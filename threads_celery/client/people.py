"""What waits for a person, and a person's answers: parked calls and calls awaiting approval or a
variable, approving (with edited arguments, remembered for the thread, or inside the caller's
transaction), denying and resolving them, and the thread's remembered grants. A mixin of
:class:`~threads_celery.client.threads.Threads`.
"""

from __future__ import annotations

from contextlib import nullcontext
from typing import TYPE_CHECKING, Any

from threads_celery.client.caller_tx import CallerTransaction
from threads_celery.exceptions import CallNotFound, RunNotFound
from threads_celery.records import OutboxEntry, PermissionGrant
from threads_celery.transitions import interventions, runs
from threads_celery.transitions.interventions import Resolution
from threads_celery.transitions.pending import PendingCall, pending_under

if TYPE_CHECKING:
    from threads_celery.definitions.agents import AgentRegistry
    from threads_celery.store import Store, Tx
    from threads_celery.transitions.publishing import Publisher


#: The statuses of a call that waits for a person (and of a run that stops there).
NEEDS_A_PERSON = ("parked", "awaiting_approval", "awaiting_variable")


class PeopleMixin:
    """Calls that wait for a person, and their answers (a mixin of :class:`~threads_celery.client.threads.Threads`)."""

    store: Store
    registry: AgentRegistry
    publisher: Publisher

    if TYPE_CHECKING:

        def _sent(self, entries: list[OutboxEntry], threads: set[str]) -> None: ...

    def parked(self, *, tenant: str | None = None) -> list[PendingCall]:
        """Calls that wait for a person: parked after an interruption, awaiting approval or a variable.

        With ``tenant``, only those in its threads, chosen in the query, so that another tenant's
        calls never crowd its own out of the list (what the HTTP API passes for its caller)."""
        with self.store.read() as tx:
            if tenant is None:
                calls = [c for status in NEEDS_A_PERSON for c in tx.calls_with_status(status)]
            else:
                found = tx.tenant_waiting_calls(tenant, NEEDS_A_PERSON, limit=200 * len(NEEDS_A_PERSON))
                calls = sorted(found, key=lambda c: NEEDS_A_PERSON.index(c.status))  # stable: oldest first
        return [PendingCall.of(c) for c in calls]

    def resolve(
        self,
        effect_key: str,
        resolution: Resolution,
        *,
        principal: str,
        result: Any = None,
    ) -> None:
        """Settle a parked call: ``assume_done`` (records ``result``) or ``assume_not_done`` (runs it again)."""
        with self.store.transaction() as tx:
            entries = interventions.resolve(
                tx, effect_key, resolution, principal=principal, now=runs.utcnow(), result=result
            )
        self.publisher(entries)

    def approve(
        self,
        effect_key: str,
        *,
        principal: str,
        override_args: dict[str, Any] | None = None,
        remember: bool = False,
        within: Any = None,
    ) -> None:
        """Approve a call that awaits approval, for its exact (or edited, re-validated) arguments.

        ``remember=True`` also means "always allow this tool on this thread" (the call's thread):
        a durable decision, listed by :meth:`permission_grants` and undone by
        :meth:`revoke_permission`. ``within`` records the approval in the caller's transaction,
        as :meth:`start` does: the call runs once that commits, never if it rolls back.
        """
        caller = CallerTransaction(within, self.store) if within is not None else None
        with self.store.transaction() if caller is None else nullcontext(caller.tx) as tx:
            entries = interventions.approve(
                tx,
                self.registry,
                effect_key,
                principal=principal,
                now=runs.utcnow(),
                override_args=override_args,
                remember=remember,
            )
        if caller is None:
            self.publisher(entries)
            return

        def approved(t: Tx) -> bool:
            found = t.get_call_and_run(effect_key)
            return found is not None and found[0].status != "awaiting_approval"

        caller.after_commit(lambda: self._sent(entries, set(caller.tx.event_threads)), approved)

    def pending(self, run_id: str) -> list[PendingCall]:
        """What waits for a person under a run: its own calls, then its child runs' (``kind="child"``).

        A child's entry is answered here like any other, by its effect key (``approve``,
        ``deny``, ``resolve``). Raises RunNotFound for an unknown run.
        """
        with self.store.read() as tx:
            if tx.get_run(run_id) is None:
                raise RunNotFound(run_id)
            return pending_under(tx, run_id)

    def permission_grants(self, thread_id: str) -> list[PermissionGrant]:
        """The thread's remembered decisions ("always allow this tool on this thread")."""
        with self.store.read() as tx:
            return tx.list_grants(thread_id)

    def revoke_permission(self, thread_id: str, tool: str, *, principal: str | None = None) -> bool:
        """Forget "always allow ``tool``" on the thread; whether there was such a decision.

        With ``principal``, a revocation is also recorded in the thread's event log
        (``permission.revoked``: the tool and who revoked it)."""
        with self.store.transaction() as tx:
            revoked = tx.revoke_grant(thread_id, tool)
            if revoked and principal is not None:
                payload = {"tool": tool, "principal": principal}
                tx.append_event(thread_id, None, "permission.revoked", payload, runs.utcnow())
            return revoked

    def deny(self, effect_key: str, reason: str, *, principal: str | None = None) -> None:
        """Deny a call that awaits approval; the model sees ``denied: <reason>``."""
        with self.store.transaction() as tx:
            entries = interventions.deny(tx, effect_key, reason=reason, now=runs.utcnow(), principal=principal)
        self.publisher(entries)

    def tool_result(self, effect_key: str) -> str | None:
        """A tool call's whole result, also when the model was shown it shortened
        (``THREADS_MAX_TOOL_RESULT_BYTES``); None while the call has none. CallNotFound if no such call."""
        with self.store.read() as tx:
            found = tx.tool_result(effect_key)
        if found is None:
            raise CallNotFound(effect_key)
        _, shown, whole, _ = found
        return whole if whole is not None else shown


__all__ = ["NEEDS_A_PERSON", "PeopleMixin"]
