"""The runtime handle a web app or script holds: start runs, wait, read, cancel.

Importing this module pulls in neither users' tool code, nor the model layer, nor worker code: a
web app enqueues runs by agent name, and workers (which import the agents) do the work.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from datetime import UTC, date, datetime
from pathlib import Path
from types import EllipsisType
from typing import Any, Self

from sqlalchemy.exc import OperationalError

from threads_celery.client.agent_tools import AgentToolsMixin
from threads_celery.client.branches import BranchesMixin
from threads_celery.client.caller_tx import CallerTransaction
from threads_celery.client.history import HistoryMixin
from threads_celery.client.in_process import InProcessWorkerMixin
from threads_celery.client.live import LiveMixin
from threads_celery.client.people import NEEDS_A_PERSON, PeopleMixin
from threads_celery.decisions.usage import ALLOWED_EVENT, LIMIT_REASON, day_bounds
from threads_celery.definitions.agents import Agent, AgentRegistry
from threads_celery.definitions.variables import SecretBox, VariableError
from threads_celery.exceptions import (
    ConfigError,
    PayloadTooLarge,
    RunNotFound,
    RunTimeout,
    ThreadNotFound,
    UnknownAgent,
)
from threads_celery.records import (
    TERMINAL_STATUSES,
    Event,
    Message,
    OutboxEntry,
    Run,
    RunHandle,
    UsageTotals,
)
from threads_celery.settings import Settings
from threads_celery.store import Store, Tx
from threads_celery.store.availability import store_unavailable
from threads_celery.store.engine import safe_url
from threads_celery.store.storable import unstorable_reason
from threads_celery.transitions import finish_callbacks, runs
from threads_celery.transitions.publishing import EMBEDDED_BROKER, Publisher, celery_app, open_store

DEFAULT_EMBEDDED_PATH = Path(".threads-celery") / "embedded.db"
#: ``wait()`` reads the run again after this share of the time waited so far, within these bounds.
WAIT_POLL_SHARE = 0.05
WAIT_POLL_MIN_S = 0.004
WAIT_POLL_MAX_S = 0.2


class Threads(AgentToolsMixin, BranchesMixin, InProcessWorkerMixin, LiveMixin, PeopleMixin, HistoryMixin):
    """The runtime handle.

    ``Threads(database_url=..., broker_url=...)`` talks to a PostgreSQL ledger and a broker
    (defaults: ``THREADS_DATABASE_URL``, ``THREADS_BROKER_URL``). With neither set, it is the
    embedded default: SQLite and an in-process Celery worker, as :meth:`embedded` gives.
    """

    def __init__(
        self,
        database_url: str | None = None,
        broker_url: str | None = None,
        *,
        settings: Settings | None = None,
        registry: AgentRegistry | None = None,
        migrate: bool | None = None,
        embedded_path: str | os.PathLike[str] | None = None,
        worker_concurrency: int = 2,
        reconcile_interval: float | EllipsisType | None = ...,
    ) -> None:
        settings = settings or Settings.from_env()
        database_url = database_url or settings.database_url
        broker_url = broker_url or settings.broker_url
        self.is_embedded = database_url is None and broker_url is None
        if self.is_embedded:
            path = Path(embedded_path) if embedded_path is not None else DEFAULT_EMBEDDED_PATH
            database_url = f"sqlite:///{path}"
            broker_url = EMBEDDED_BROKER
        elif database_url is None:
            raise ConfigError("a broker is configured but no database: set THREADS_DATABASE_URL")
        elif broker_url is None:
            raise ConfigError("a database is configured but no broker: set THREADS_BROKER_URL")
        assert database_url is not None and broker_url is not None
        self.settings = settings.with_(database_url=database_url, broker_url=broker_url)
        self.registry = registry or AgentRegistry()
        self.store: Store = open_store(database_url, self.settings)
        if self.settings.live_deltas:  # what this handle commits reaches live streams at once
            self.store.on_events_committed = self._nudge_live
        # The app publishes; the worker side (its tasks, the runtime) is installed on it only
        # when this process starts a worker or ticks the backbone (see client.in_process).
        self.app = celery_app(self.settings, broker_url=broker_url)
        self.publisher = Publisher(
            self.app, single_queue=self.app.conf.task_default_queue if self.is_embedded else None
        )
        self._worker = None
        self._worker_concurrency = worker_concurrency
        # The embedded worker runs the reconcile backbone itself (Beat's job in a deployment).
        self._reconcile_interval = (
            self.settings.reconcile_interval_s if reconcile_interval is ... else reconcile_interval
        )
        self._schema_checked = False
        if migrate if migrate is not None else self.store.dialect == "sqlite":
            self.migrate()

    # -- lifecycle -------------------------------------------------------------------------

    @classmethod
    @contextmanager
    def embedded(
        cls,
        path: str | os.PathLike[str] | None = None,
        *,
        concurrency: int = 2,
        settings: Settings | None = None,
        reconcile_interval: float | EllipsisType | None = ...,
    ) -> Iterator[Threads]:
        """SQLite, an in-process Celery worker and a reconcile ticker (every
        ``reconcile_interval`` seconds; the settings' interval by default, None for none).
        A fresh temporary database when ``path`` is None."""
        tmp = tempfile.mkdtemp(prefix="threads-celery-")
        db = Path(path) if path is not None else Path(tmp) / "threads.db"
        base = settings or Settings.from_env(env={})
        threads = cls(
            settings=base.with_(database_url=None, broker_url=None),
            embedded_path=db,
            worker_concurrency=concurrency,
            reconcile_interval=reconcile_interval,
        )
        try:
            threads.start_worker()
            yield threads
        finally:
            # The worker finishes stopping in the background: remove the temporary folder now,
            # and again once the worker let go of the database in it (a late write may have
            # put a journal file back).
            threads.close(then=lambda: shutil.rmtree(tmp, ignore_errors=True))
            shutil.rmtree(tmp, ignore_errors=True)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def migrate(self) -> None:
        """Bring the ledger's schema up to date."""
        # Alembic is loaded by a client that checks or migrates its own ledger only: a web app
        # that publishes to a deployed fleet never does.
        from threads_celery.store.migrate import upgrade

        try:
            upgrade(self.store.engine)
        except Exception as exc:
            _raise_if_unreachable(self.store, exc)
            raise
        self._schema_checked = True

    def _check_schema(self) -> None:
        if self._schema_checked:
            return
        # Alembic on first use only, as in migrate().
        from threads_celery.store.migrate import current_revision, head_revision

        try:
            current = current_revision(self.store.engine)
        except Exception as exc:
            _raise_if_unreachable(self.store, exc)
            raise
        if current != head_revision():
            raise ConfigError(
                f"the database at {safe_url(self.store.engine.url)} is at migration {current or 'none'}, "
                f"not {head_revision()}: run `threads-celery db upgrade`"
            )
        self._schema_checked = True

    # -- agents ----------------------------------------------------------------------------

    def register(self, agent: Agent) -> Agent:
        """Make ``agent`` known to this process and to the ledger (so clients can start it by name)."""
        self.registry.add(agent)
        self._check_schema()
        with self.store.transaction() as tx:
            tx.upsert_agent(agent.name, agent.config_hash(), agent.describe(), runs.utcnow())
        return agent

    # -- runs ------------------------------------------------------------------------------

    def start(
        self,
        agent: Agent | str,
        message: str,
        thread_id: str | None = None,
        env: dict[str, str] | None = None,
        *,
        run_id: str | None = None,
        tenant: str | None = None,
        within: Any = None,
        on_finish: Any = None,
    ) -> RunHandle:
        """Record a run and enqueue its first step; returns its ids at once.

        ``on_finish`` (a Celery signature of a task of yours, e.g. ``record_answer.s(order_id)``)
        is sent when the run ends, however it ends, with ``{"run_id", "thread_id", "agent",
        "status"}`` put first: a task that starts a run ends at once instead of holding its worker
        slot in ``wait``. Sent at least once, durably (see :mod:`~threads_celery.transitions.finish_callbacks`).

        ``within`` (a SQLAlchemy ``Session`` or ``Connection`` with a transaction open, a psycopg 3
        connection in a transaction, or Django's ``connection`` inside ``transaction.atomic()``,
        on the store's own database) writes the run in that transaction: it commits with the
        caller's rows or vanishes with them, and its first step is sent only once the commit is
        visible (by the reconcile backbone, if this process dies before). See :mod:`.caller_tx`.

        A message sent to a thread that is running is queued behind the current run.
        ``tenant`` (what the HTTP API passes for its caller) owns a new thread; an existing
        thread or run of another tenant is ``ThreadNotFound``/``RunNotFound``. Without it, a new
        thread belongs to the default tenant and existing ones are not checked. Embedded (this
        process runs the steps), an agent whose model's provider package is not installed is
        refused with ModelUnavailable, naming the extra to install, before anything is recorded.
        """
        if not isinstance(message, str):
            raise TypeError(f"message must be a str, not {type(message).__name__}")
        unstorable = unstorable_reason(message)
        if unstorable is not None:
            raise ValueError(f"message {unstorable}")
        size = len(message.encode())
        if size > self.settings.max_message_bytes:
            raise PayloadTooLarge(size, self.settings.max_message_bytes)
        self._check_schema()
        known_hash: str | None = None
        if isinstance(agent, Agent):
            self._check_runnable_here(agent)
            if agent.name not in self.registry or self.registry.get(agent.name) is not agent:
                self.register(agent)
            name, known_hash = agent.name, agent.config_hash()
        else:
            name = agent
            if name in self.registry:
                self._check_runnable_here(self.registry.get(name))
        # The common start, a new thread, is one statement on PostgreSQL, which also reads the
        # agent's recorded hash; elsewhere that is read first.
        callback = None
        if on_finish is not None:
            if self.is_embedded:
                raise ConfigError(
                    "on_finish sends a task of your Celery app when the run ends: an embedded runtime "
                    "has no app of yours to send it with (start the run on a worker fleet)"
                )
            callback = finish_callbacks.signature_spec(on_finish)
        in_one = (
            within is None
            and callback is None
            and thread_id is None
            and run_id is None
            and not env
            and self.store.starts_in_one_statement
        )
        if known_hash is None and not in_one:
            with self.store.read() as tx:
                known_hash = tx.agent_hash(name)
            if known_hash is None:
                raise _unknown_agent(name)
        if self.is_embedded:
            self.start_worker()
        else:
            self.publisher.ensure_reachable()
        if in_one:
            started = runs.start_on_new_thread(
                self.store, agent=name, config_hash=known_hash, message=message, tenant=tenant, now=runs.utcnow()
            )
            if started is None:
                raise _unknown_agent(name)
            self.publisher(started[2])
            return RunHandle(run_id=started[0], thread_id=started[1], status="queued")
        assert known_hash is not None
        config_hash = known_hash
        caller = CallerTransaction(within, self.store) if within is not None else None
        with self.store.transaction() if caller is None else nullcontext(caller.tx) as tx:
            sealed = self._seal_env(tx, name, env or {})
            run, entries = runs.submit_run(
                tx,
                agent=name,
                config_hash=config_hash,
                message=message,
                now=runs.utcnow(),
                thread_id=thread_id,
                run_id=run_id,
                tenant=tenant,
                input_meta={finish_callbacks.META_KEY: callback} if callback is not None else None,
            )
            for var, (kind, value) in sealed.items():
                tx.set_variable(run.thread_id, var, kind, value, runs.utcnow())
        if caller is None:
            self.publisher(entries)
        else:
            written = run.id
            caller.after_commit(lambda: self._sent(entries, {run.thread_id}), lambda t: t.get_run(written) is not None)
        return RunHandle(run_id=run.id, thread_id=run.thread_id, status=run.status)

    def _sent(self, entries: list[OutboxEntry], threads: set[str]) -> None:
        """Send what a caller's transaction committed, and wake the live streams of its threads."""
        self.publisher(entries)
        if self.store.on_events_committed is not None:
            self.store.on_events_committed(frozenset(threads))

    # -- variables -------------------------------------------------------------------------

    def _seal_env(self, tx: Tx, agent: str, env: dict[str, str]) -> dict[str, tuple[str, str]]:
        """Values by declared type (from the agent tree's declarations); secrets encrypted."""
        if not env:
            return {}
        declared = (tx.agent_description(agent) or {}).get("variables", {})
        sealed: dict[str, tuple[str, str]] = {}
        for name, value in env.items():
            if name not in declared:
                raise ConfigError(f"variable {name!r} is not declared by agent {agent!r} or its tools")
            if not isinstance(value, str):
                raise ConfigError(f"variable {name!r} must be a string")
            kind = declared[name]["type"]
            sealed[name] = (kind, SecretBox().seal(value) if kind == "secret" else value)
        return sealed

    def set_env(self, thread_id: str, name: str, value: str, *, principal: str | None = None) -> int:
        """Give the thread a variable's value; runs waiting for it go on. Returns how many.

        ``principal``, when given, is recorded in the thread's ``env`` event as who set it."""
        now = runs.utcnow()
        entries: list[OutboxEntry] = []
        with self.store.transaction() as tx:
            thread = tx.get_thread(thread_id)
            if thread is None:
                raise ThreadNotFound(thread_id)
            sealed = self._seal_env(tx, thread.agent, {name: value})
            tx.set_variable(thread_id, name, *sealed[name], now)
            payload = {"name": name, "type": sealed[name][0]}
            if principal is not None:
                payload["principal"] = principal
            tx.append_event(thread_id, None, "env", payload, now)
            for call in tx.calls_with_status("awaiting_variable", limit=1000):
                if thread_id not in {t for t, _ in tx.thread_chain(call.thread_id)}:
                    continue
                run = tx.get_run(call.run_id, lock=True)
                if run is None or run.status != "awaiting_variable":
                    continue
                tx.update_call(call.effect_key, status="pending", park_reason=None)
                tx.advance_run(run.id, fence=run.fence, now=now, status="running")
                entry = runs.tool_entry(call.effect_key, call.tool, call.queue)
                tx.insert_outbox(entry, now)
                entries.append(entry)
        self.publisher(entries)
        return len(entries)

    def get_env(self, thread_id: str, name: str) -> str | None:
        """A text variable's value on this thread (its own, not inherited); None if unset.

        A secret cannot be read here: only a tool that declares it sees it (VariableError).
        """
        with self.store.read() as tx:
            found = tx.thread_variables(thread_id).get(name)
        if found is None:
            return None
        kind, value = found
        if kind == "secret":
            raise VariableError(f"variable {name!r} is a secret: only a tool that declares it can read it")
        return value

    def env(self, thread_id: str) -> dict[str, str]:
        """The thread's own variables; secret values are never shown (``***``)."""
        with self.store.read() as tx:
            values = tx.thread_variables(thread_id)
        return {name: ("***" if kind == "secret" else value) for name, (kind, value) in values.items()}

    def tenant_of(
        self, *, thread_id: str | None = None, run_id: str | None = None, effect_key: str | None = None
    ) -> str | None:
        """The tenant that owns this thread, run or tool call (exactly one); None when there is none."""
        if sum(x is not None for x in (thread_id, run_id, effect_key)) != 1:
            raise TypeError("tenant_of() takes exactly one of thread_id, run_id, effect_key")
        with self.store.read() as tx:
            if run_id is not None:
                run = tx.get_run(run_id)
                thread_id = run.thread_id if run is not None else None
            elif effect_key is not None:
                found = tx.get_call_and_run(effect_key)
                thread_id = found[1].thread_id if found is not None else None
            return tx.thread_tenant(thread_id) if thread_id is not None else None

    def get_run(self, run_id: str) -> Run:
        """The run's current snapshot; RunNotFound if there is none."""
        with self.store.read() as tx:
            run = tx.get_run(run_id)
        if run is None:
            raise RunNotFound(run_id)
        return run

    def wait(self, run_id: str, timeout: float = 60.0) -> Run:
        """Block until the run ends or needs a person; RunTimeout after ``timeout`` seconds."""
        began = time.monotonic()
        deadline = began + timeout
        while True:
            run = self.get_run(run_id)
            if run.status in TERMINAL_STATUSES or run.status in NEEDS_A_PERSON:
                return run
            now = time.monotonic()
            if now >= deadline:
                raise RunTimeout(run_id, timeout, run.status)
            # Read again after a twentieth of the time waited so far (4 ms to 200 ms): the end is
            # seen at most 4 ms or 5% late, in about 47 reads per tenfold of the wait.
            time.sleep(min(max(WAIT_POLL_MIN_S, (now - began) * WAIT_POLL_SHARE), WAIT_POLL_MAX_S, deadline - now))

    def runs(
        self, *, thread_id: str | None = None, status: str | None = None, limit: int = 100, tenant: str | None = None
    ) -> list[Run]:
        """Recent runs, newest first (only those of ``tenant``'s threads, when given)."""
        with self.store.read() as tx:
            return tx.list_runs(thread_id=thread_id, statuses=[status] if status else None, limit=limit, tenant=tenant)

    def allow_usage(self, run_id: str, *, principal: str) -> Run:
        """Let a run parked at a usage limit (``on_limit="ask"``) go on: its usage counts again
        from now, and its next model step is enqueued. ConfigError when it is not so parked."""
        if not isinstance(principal, str) or not principal.strip():
            raise ConfigError("allow_usage needs the principal who allows it")
        now = runs.utcnow()
        with self.store.transaction() as tx:
            run = tx.get_run(run_id, lock=True)
            if run is None:
                raise RunNotFound(run_id)
            if run.status != "parked" or not (run.error or "").startswith(f"{LIMIT_REASON}:"):
                raise ConfigError(f"run {run_id} is {run.status}, not parked at a usage limit")
            tx.append_event(
                run.thread_id,
                run.id,
                ALLOWED_EVENT,
                {"run_id": run.id, "principal": principal, "at": now.isoformat()},
                now,
            )
            if tx.advance_run(run.id, fence=run.fence, now=now, status="running", error=None) is None:
                raise ConfigError(f"run {run_id} changed meanwhile; try again")
            entry = runs.step_entry(run, run.step, run.agent, runs.agent_queue(tx, run.agent))
            tx.insert_outbox(entry, now)
        self.publisher([entry])
        return self.get_run(run_id)

    def usage(
        self,
        *,
        run_id: str | None = None,
        thread_id: str | None = None,
        agent: str | None = None,
        day: date | None = None,
        tenant: str | None = None,
    ) -> UsageTotals:
        """Model usage summed over the committed steps that match every filter given: a run, a
        thread, an agent, a UTC day, a tenant's threads (requests, input and output tokens, cost
        where priced)."""
        since = until = None
        if day is not None:
            since, until = day_bounds(datetime(day.year, day.month, day.day, tzinfo=UTC))
        with self.store.read() as tx:
            return tx.usage_totals(
                run_id=run_id, thread_id=thread_id, agent=agent, since=since, until=until, tenant=tenant
            )

    def messages(self, thread_id: str, *, after: int = -1, include_superseded: bool = False) -> list[Message]:
        """The thread's stored messages in order (those with ``seq`` greater than ``after``): its
        current branch, or with ``include_superseded`` also those a rewind, regenerate or edit left
        behind (their ``superseded_by`` names the branch; see :meth:`branches`)."""
        with self.store.read() as tx:
            return tx.list_messages(thread_id, after=after, include_superseded=include_superseded)

    def events(
        self,
        thread_id: str,
        after: int = 0,
        *,
        follow: bool = False,
        timeout: float | None = None,
        poll_interval: float = 0.05,
    ) -> Iterator[Event]:
        """The thread's events with ``seq`` greater than ``after``, in order; each exactly once.

        With ``follow=True`` it keeps tailing the log after the replay (until ``timeout``
        seconds pass, if given). Resume after a disconnect by passing the last ``seq`` seen.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        cursor = after
        while True:
            with self.store.read() as tx:
                batch = tx.list_events(thread_id, after=cursor)
            for event in batch:
                cursor = event.seq
                yield event
            if batch:
                continue
            if not follow or (deadline is not None and time.monotonic() >= deadline):
                return
            time.sleep(poll_interval)

    def cancel(self, run_id: str, reason: str = "cancelled") -> Run:
        """Abort a run; a run that already ended is left as it is."""
        with self.store.transaction() as tx:
            run, entries = runs.cancel(tx, run_id, now=runs.utcnow(), reason=reason)
        self.publisher(entries)
        if run.status == "aborted":
            self._cancel_awaited_children(run, reason)
        return run

    def pick_up(self, run_id: str) -> int:
        """Embedded: run here the tasks that run ``run_id`` and its child runs wait on, and return
        how many were handed to this process's worker (started if need be).

        An embedded process's tasks travel in its own memory: a decision recorded by a process
        that had no worker (``threads-celery approve`` without ``--agent``), or a process that
        stopped mid-run, leaves its next tasks only in the ledger's outbox, where the reconcile
        backbone would find them after a grace. This publishes them now. Publishing a task twice
        is safe (each decides from the ledger), so a row another live process still holds costs
        nothing but a skipped task. Register the run's agents first: a task of an agent this
        process does not know fails. With a broker, the workers and Beat carry runs on: 0.
        """
        if not self.is_embedded:
            return 0
        with self.store.read() as tx:
            root = tx.get_run(run_id)
            if root is None:
                raise RunNotFound(run_id)
            run_ids, agent_tool_ids, threads = [root.id], [], [(root.thread_id, root.id)]
            while threads:  # the tree of child runs, breadth first
                thread_id, parent = threads.pop(0)
                for row in tx.list_agent_tool_runs(thread_id):
                    if row.parent_run_id != parent or row.run_id in agent_tool_ids:
                        continue
                    agent_tool_ids.append(row.run_id)
                    if row.child_run_id is not None and row.child_thread_id is not None:
                        run_ids.append(row.child_run_id)
                        threads.append((row.child_thread_id, row.child_run_id))
            entries = tx.outbox_of_runs(run_ids, agent_tool_ids)
        if entries:
            self.start_worker()
            self.publisher(entries)
        return len(entries)

    def _cancel_awaited_children(self, run: Run, reason: str) -> None:
        """A cancelled run's awaited agent-tool children stop with it; detached ones outlive it."""
        with self.store.read() as tx:
            rows = tx.list_agent_tool_runs(run.thread_id, statuses=["starting", "running", "interrupted"])
        for row in rows:
            if row.parent_run_id == run.id and not row.detached:
                self.cancel_agent_tool(row.run_id, reason=reason)


def _raise_if_unreachable(store: Store, exc: Exception) -> None:
    if isinstance(exc, OperationalError):
        raise store_unavailable(store.engine.url, exc) from exc


__all__ = ["Threads"]


def _unknown_agent(name: str) -> UnknownAgent:
    return UnknownAgent(
        f"agent {name!r} is not registered: start a worker that loads it (THREADS_AGENTS) or call threads.register(agent)"
    )
