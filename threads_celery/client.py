"""The runtime handle a web app or script holds: start runs, wait, read, cancel.

Importing this module pulls in neither users' tool code nor the model layer: a web app enqueues
runs by agent name, and workers (which import the agents) do the work.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from . import interventions, runs
from .agents import Agent, AgentRegistry
from .exceptions import ConfigError, PayloadTooLarge, RunNotFound, RunTimeout, StoreUnavailable, UnknownAgent
from .interventions import PendingCall
from .records import TERMINAL_STATUSES, Event, Message, Run, RunHandle
from .settings import Settings
from .store import Store
from .store.engine import safe_url
from .worker import EMBEDDED_BROKER, Publisher, create_app, open_store

#: Statuses in which a run waits for a person, so :meth:`Threads.wait` returns.
NEEDS_A_PERSON = frozenset({"parked", "awaiting_approval", "awaiting_variable"})
DEFAULT_EMBEDDED_PATH = Path(".threads-celery") / "embedded.db"


class Threads:
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
        self.app = create_app(self.settings, self.registry, broker_url=broker_url, store=self.store)
        self.publisher = Publisher(self.app)
        self._worker: Any = None
        self._worker_concurrency = worker_concurrency
        self._schema_checked = False
        if migrate if migrate is not None else self.store.dialect == "sqlite":
            self.migrate()

    # -- lifecycle -------------------------------------------------------------------------

    @classmethod
    @contextmanager
    def embedded(
        cls, path: str | os.PathLike[str] | None = None, *, concurrency: int = 2, settings: Settings | None = None
    ) -> Iterator[Threads]:
        """SQLite plus an in-process Celery worker; a fresh temporary database when ``path`` is None."""
        import tempfile

        with tempfile.TemporaryDirectory(prefix="threads-celery-") as tmp:
            db = Path(path) if path is not None else Path(tmp) / "threads.db"
            base = settings or Settings.from_env(env={})
            threads = cls(
                settings=base.with_(database_url=None, broker_url=None),
                embedded_path=db,
                worker_concurrency=concurrency,
            )
            try:
                threads.start_worker()
                yield threads
            finally:
                threads.close()

    def start_worker(self) -> None:
        """Start the in-process worker (embedded mode only; idempotent)."""
        if not self.is_embedded:
            raise ConfigError("an in-process worker runs only in embedded mode; run `threads-celery worker`")
        if self._worker is None:
            from .embedded import EmbeddedWorker

            self._worker = EmbeddedWorker(self.app, concurrency=self._worker_concurrency)
            self._worker.start()

    def close(self) -> None:
        """Stop the in-process worker, if any, and release connections."""
        if self._worker is not None:
            self._worker.stop()
            self._worker = None
        self.store.dispose()

    def __enter__(self) -> Threads:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def migrate(self) -> None:
        """Bring the ledger's schema up to date."""
        from .store.migrate import upgrade

        try:
            upgrade(self.store.engine)
        except Exception as exc:
            _raise_if_unreachable(self.store, exc)
            raise
        self._schema_checked = True

    def _check_schema(self) -> None:
        if self._schema_checked:
            return
        from .store.migrate import head_revision, current_revision

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
    ) -> RunHandle:
        """Record a run and enqueue its first step; returns its ids at once.

        A message sent to a thread that is running is queued behind the current run.
        """
        if not isinstance(message, str):
            raise TypeError(f"message must be a str, not {type(message).__name__}")
        size = len(message.encode())
        if size > self.settings.max_message_bytes:
            raise PayloadTooLarge(size, self.settings.max_message_bytes)
        if env:
            raise ConfigError("variables (env=...) are not supported yet")
        self._check_schema()
        if isinstance(agent, Agent):
            if agent.name not in self.registry or self.registry.get(agent.name) is not agent:
                self.register(agent)
            name, config_hash = agent.name, agent.config_hash()
        else:
            name = agent
            with self.store.read() as tx:
                config_hash = tx.agent_hash(name)
            if config_hash is None:
                raise UnknownAgent(
                    f"agent {name!r} is not registered: start a worker that loads it "
                    "(THREADS_AGENTS) or call threads.register(agent)"
                )
        if self.is_embedded:
            self.start_worker()
        else:
            self.publisher.check()
        with self.store.transaction() as tx:
            run, entries = runs.submit_run(
                tx,
                agent=name,
                config_hash=config_hash,
                message=message,
                now=runs.utcnow(),
                thread_id=thread_id,
                run_id=run_id,
            )
        self.publisher(entries)
        return RunHandle(run_id=run.id, thread_id=run.thread_id, status=run.status)

    def get_run(self, run_id: str) -> Run:
        """The run's current snapshot; RunNotFound if there is none."""
        with self.store.read() as tx:
            run = tx.get_run(run_id)
        if run is None:
            raise RunNotFound(run_id)
        return run

    def wait(self, run_id: str, timeout: float = 60.0) -> Run:
        """Block until the run ends or needs a person; RunTimeout after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        delay = 0.005
        while True:
            run = self.get_run(run_id)
            if run.status in TERMINAL_STATUSES or run.status in NEEDS_A_PERSON:
                return run
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise RunTimeout(run_id, timeout, run.status)
            time.sleep(min(delay, remaining))
            delay = min(delay * 1.5, 0.2)

    def runs(self, *, thread_id: str | None = None, status: str | None = None, limit: int = 100) -> list[Run]:
        """Recent runs, newest first."""
        with self.store.read() as tx:
            return tx.list_runs(thread_id=thread_id, statuses=[status] if status else None, limit=limit)

    def messages(self, thread_id: str, *, after: int = -1) -> list[Message]:
        """The thread's stored messages in order (those with ``seq`` greater than ``after``)."""
        with self.store.read() as tx:
            return tx.list_messages(thread_id, after=after)

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
        return run


    # -- people ----------------------------------------------------------------------------

    def parked(self) -> list[PendingCall]:
        """Calls that wait for a person: parked after an interruption, or awaiting approval."""
        with self.store.read() as tx:
            calls = tx.calls_with_status("parked") + tx.calls_with_status("awaiting_approval")
        return [PendingCall.of(c) for c in calls]

    def resolve(
        self,
        effect_key: str,
        resolution: str,
        *,
        principal: str,
        result: Any = None,
    ) -> None:
        """Settle a parked call: ``assume_done`` (records ``result``) or ``assume_not_done`` (runs it again)."""
        with self.store.transaction() as tx:
            entries = interventions.resolve(
                tx, effect_key, resolution, principal=principal, now=runs.utcnow(), result=result  # type: ignore[arg-type]
            )
        self.publisher(entries)

    def approve(self, effect_key: str, *, principal: str, override_args: dict[str, Any] | None = None) -> None:
        """Approve a call that awaits approval, for its exact (or edited, re-validated) arguments."""
        with self.store.transaction() as tx:
            entries = interventions.approve(
                tx, self.registry, effect_key, principal=principal, now=runs.utcnow(), override_args=override_args
            )
        self.publisher(entries)

    def deny(self, effect_key: str, reason: str, *, principal: str | None = None) -> None:
        """Deny a call that awaits approval; the model sees ``denied: <reason>``."""
        with self.store.transaction() as tx:
            entries = interventions.deny(tx, effect_key, reason=reason, now=runs.utcnow(), principal=principal)
        self.publisher(entries)

    def reconcile(self) -> dict[str, int]:
        """Run one reconcile tick in this process (what Beat schedules)."""
        return self.app.threads_runtime.get().reconcile_tick()  # type: ignore[attr-defined]


def _raise_if_unreachable(store: Store, exc: Exception) -> None:
    from sqlalchemy.exc import OperationalError

    if isinstance(exc, OperationalError):
        orig = getattr(exc, "orig", exc)
        raise StoreUnavailable(
            f"cannot reach the database at {safe_url(store.engine.url)}: {str(orig).strip().splitlines()[0] if str(orig).strip() else type(orig).__name__}"
        ) from exc


__all__ = ["Threads"]
