"""A tool call's variables: its declarations resolved against its thread and the threads above it.

What a variable is, how secrets are sealed, and the pure rule that picks a value along a chain of
threads are in :mod:`threads_celery.definitions.variables`; here that chain is read from the
ledger, each time a tool reads a variable.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from threads_celery.definitions.variables import SecretBox, Variable, VariableError, resolve
from threads_celery.exceptions import SecretUndecryptable
from threads_celery.redaction import redact_text

if TYPE_CHECKING:
    from threads_celery.definitions.agents import AgentRegistry
    from threads_celery.records import Run
    from threads_celery.store import Store, Tx


class ThreadEnv:
    """The variables one tool call can read: its declarations resolved against its thread."""

    def __init__(
        self,
        store: Store,
        registry: AgentRegistry,
        thread_id: str,
        declarations: Mapping[str, Variable],
        *,
        owner: str,
        box: SecretBox | None = None,
    ) -> None:
        self.store = store
        self.registry = registry
        self.thread_id = thread_id
        self.declarations = dict(declarations)
        self.owner = owner
        self.box = box or SecretBox()
        self.revealed: list[str] = []
        #: Secrets this call could not decrypt: the run then ends in error whatever the tool did
        #: with the exception (a worker with the wrong key must not finish runs as if all was well).
        self.undecryptable: list[str] = []

    def _chain(self, tx: Tx) -> list[tuple[Mapping[str, tuple[str, str]], Callable[[str], bool]]]:
        chain: list[tuple[Mapping[str, tuple[str, str]], Callable[[str], bool]]] = []
        for thread_id, agent_name in tx.thread_chain(self.thread_id):
            agent = self.registry.get(agent_name) if agent_name in self.registry else None
            scoped = {v.name for v in agent.declared_variables().values() if v.scoped} if agent else set()
            chain.append((tx.thread_variables(thread_id), scoped.__contains__))
        return chain

    def get(self, name: str) -> str | None:
        """The value of a declared variable for this thread, or None when it has none."""
        if name not in self.declarations:
            raise VariableError(f"variable {name!r} is not declared by {self.owner}")
        with self.store.read() as tx:
            found = resolve(name, self._chain(tx))
        if found is None:
            return None
        kind, stored = found
        if kind == "secret":
            try:
                value = self.box.open(stored, name=name)
            except SecretUndecryptable:
                self.undecryptable.append(name)
                raise
            self.revealed.append(value)
            return value
        return stored

    def secret_values(self) -> list[str]:
        """Every secret value the declarations could reveal on this thread, opened quietly.

        For text the runtime builds outside a tool's call (a park reason from a reconcile lookup,
        a hook's failure): it may quote a secret the tool or lookup read by other means. One that
        cannot be opened is skipped here (the call that reads it reports that).
        """
        with self.store.read() as tx:
            chain = self._chain(tx)
        values: list[str] = []
        for name in self.declarations:
            found = resolve(name, chain)
            if found is None or found[0] != "secret":
                continue
            with contextlib.suppress(SecretUndecryptable):
                values.append(self.box.open(found[1], name=name))
        return values

    def missing_required(self) -> list[str]:
        """Required variables with no value anywhere this thread can see."""
        required = [v.name for v in self.declarations.values() if v.required]
        if not required:
            return []
        with self.store.read() as tx:
            chain = self._chain(tx)
        return [name for name in required if resolve(name, chain) is None]


def redacted_for_thread(store: Store, registry: AgentRegistry, run: Run, text: str) -> str:
    """``text`` redacted of every secret the run's agent's variables hold on its thread (a park or
    approval reason may quote one the tool or lookup read by other means)."""
    agent = registry.get(run.agent) if run.agent in registry else None
    if agent is None:
        return text
    env = ThreadEnv(store, registry, run.thread_id, agent.declared_variables(), owner=f"agent {agent.name!r}")
    secrets = env.secret_values()
    return redact_text(text, secrets) if secrets else text
