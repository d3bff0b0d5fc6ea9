"""The worker's Celery application: the configured app with the tasks installed on it, the
runtime those tasks use, and the start-up checks and signals of ``celery -A tasks worker|beat``.

The configuration, the queues and the publisher are the client's too, in
:mod:`threads_celery.transitions.publishing`; the task bodies are in
:mod:`threads_celery.worker.tasks`; Beat's scheduler is in :mod:`threads_celery.worker.beat`.
"""

from __future__ import annotations

import gc
import os
import threading
from collections.abc import Callable
from typing import Any

from celery import Celery
from celery.concurrency.prefork import TaskPool as PreforkPool
from celery.signals import celeryd_after_setup, worker_init, worker_process_init, worker_process_shutdown

from threads_celery.decisions.backbone import control_queue_for
from threads_celery.decisions.deploys import AUTO_VERSION, derive_version, version_of_queue, versioned_queue
from threads_celery.definitions.agents import AgentRegistry
from threads_celery.exceptions import ConfigError, StoreUnavailable
from threads_celery.runtime.heap import settle_heap
from threads_celery.runtime.machine import Runtime
from threads_celery.runtime.preflight import (
    Ready,
    check_models,
    check_secret_key,
    exit_on_failure,
    require_database_url,
    wait_for_database,
)
from threads_celery.runtime.schedules import ScheduleRegistry
from threads_celery.settings import Settings
from threads_celery.store import Store
from threads_celery.telemetry.metrics import METRICS_PORT_VARIABLE, serve
from threads_celery.transitions.publishing import (
    Publisher,
    celery_app,
    deploy_version_of,
    open_store,
    task_queue,
    work_queue_of,
)
from threads_celery.transitions.runs import utcnow
from threads_celery.worker import deploy_heartbeat, output_capture, quiet_ticks
from threads_celery.worker.retention_task import install_retention_task
from threads_celery.worker.tasks import install_tasks


class RuntimeHolder:
    """Builds the worker's runtime lazily, once per process (prefork children get their own)."""

    def __init__(self, app: Celery, settings: Settings, registry: AgentRegistry, store: Store | None = None) -> None:
        self.app = app
        self.settings = settings
        self.registry = registry
        self._store = store
        self._runtime: Runtime | None = None
        self.single_queue: str | None = None
        self._pid = os.getpid()
        self._lock = threading.Lock()
        #: When this process last started a reconcile tick (time.time()); see tick_is_covered.
        self.last_tick_started_at: float | None = None
        self.schedules = ScheduleRegistry()

    def get(self) -> Runtime:
        """This process's runtime, built on first use (and again after a fork)."""
        with self._lock:
            if self._runtime is None or self._pid != os.getpid():
                if self._pid != os.getpid() and self._store is not None:
                    self._store.engine.dispose(close=False)
                self._pid = os.getpid()
                if self._store is None:
                    if not self.settings.database_url:
                        raise StoreUnavailable("THREADS_DATABASE_URL is not set for this worker")
                    self._store = open_store(self.settings.database_url, self.settings)
                if self.settings.agents:
                    self.registry.load(self.settings.agents)
                    self.schedules.load(self.settings.agents)
                self._runtime = Runtime(
                    self._store,
                    self.registry,
                    publish=Publisher(self.app, single_queue=self.single_queue),
                    settings=self.settings,
                )
                self._runtime.deploy_version = None if self.single_queue else deploy_version_of(self.app)
            return self._runtime


class ThreadsCelery(Celery):
    """A Celery app that carries the runtime its tasks use, as ``app.threads_runtime``."""

    threads_runtime: RuntimeHolder
    #: Beat's start-up check (see threads_celery.worker.beat.Scheduler); None for apps that are not services.
    threads_beat_preflight: Callable[[], None] | None = None


def install_worker(
    app: Celery, settings: Settings, registry: AgentRegistry, store: Store | None = None
) -> RuntimeHolder:
    """Make ``app`` a worker's app: install the tasks and the runtime they use (``app.threads_runtime``).

    ``app`` is one :func:`threads_celery.transitions.publishing.celery_app` built: the client's,
    when it starts an in-process worker, or :func:`create_app`'s. Installing twice returns the
    runtime installed first.
    """
    installed = getattr(app, "threads_runtime", None)
    if isinstance(installed, RuntimeHolder):
        return installed
    holder = RuntimeHolder(app, settings, registry, store)
    if str(app.conf.broker_url or "").startswith("memory://"):
        # The embedded worker consumes one work queue of its own (see celery_config).
        holder.single_queue = app.conf.task_default_queue
    # The client's app is a plain Celery app (it must not know the worker's class); whoever holds
    # it (the in-process worker's ticker, Beat's scheduler, tests) reaches the runtime here.
    app.threads_runtime = holder  # type: ignore[attr-defined]  # declared on ThreadsCelery only
    install_tasks(app, holder)
    install_retention_task(app, holder)
    return holder


def create_app(
    settings: Settings,
    registry: AgentRegistry,
    *,
    broker_url: str | None = None,
    store: Store | None = None,
    main: str = "threads",
) -> ThreadsCelery:
    """A Celery app with the threads tasks installed, bound to ``registry`` and the store."""
    app = celery_app(settings, broker_url=broker_url, main=main, app_class=ThreadsCelery)
    install_worker(app, settings, registry, store)
    return app


def runtime_holder(app: Celery) -> RuntimeHolder:
    """The runtime :func:`install_worker` installed on ``app``."""
    holder = getattr(app, "threads_runtime", None)
    if not isinstance(holder, RuntimeHolder):
        raise ConfigError("this Celery app has no threads-celery runtime installed (threads_celery.install(app))")
    return holder


def preflight(app: Celery, *, service: str) -> Ready:
    """Check that ``app`` can work before it accepts any: the secret key (when set) is well formed,
    the database is set, answers and is at head, the agents of ``THREADS_AGENTS`` import, and
    their model providers can be built.

    A database that does not answer is waited for, up to ``THREADS_DATABASE_STARTUP_WAIT_S``
    (see :func:`~threads_celery.runtime.preflight.wait_for_database`).

    Raises the ThreadsError whose message says what is wrong (see :mod:`threads_celery.runtime.preflight`).
    """
    check_secret_key()
    holder = runtime_holder(app)
    if holder._store is None:
        require_database_url(holder.settings.database_url, service=service)
    runtime = holder.get()
    revision = wait_for_database(runtime.store, wait_s=holder.settings.database_startup_wait_s, service=service)
    check_models(runtime.registry)
    return Ready(revision=revision, agents=tuple(agent.name for agent in runtime.registry))


def consume_control_queue(app: Celery) -> None:
    """Make a worker consume the control queue besides the queues it was given (``-Q``).

    A worker started with ``-Q email`` for slow tools still takes reconcile ticks and finish
    deliveries, so recovery never depends on one particular worker being alive.
    """
    version = deploy_version_of(app)
    if version is not None:
        # ``-Q email`` on a worker of version V takes ``email@V`` too: the calls of V's runs there.
        for name in list(app.amqp.queues.consume_from):
            if version_of_queue(name) is None and not name.endswith(".control"):
                versioned = versioned_queue(name, version)
                if versioned is not None and versioned not in app.amqp.queues.consume_from:
                    app.amqp.queues.select_add(task_queue(versioned))
    control = control_queue_for(work_queue_of(app))
    if control not in app.amqp.queues.consume_from:
        # The queue as the app declares it (a quorum queue on RabbitMQ), else as task_queue makes it.
        declared = app.amqp.queues.get(control)
        app.amqp.queues.select_add(declared if declared is not None else task_queue(control))


def resolve_deploy_version(settings: Settings, registry: AgentRegistry) -> Settings:
    """``settings`` with ``THREADS_DEPLOY_VERSION=auto`` replaced by the version derived from the
    config hashes of the agents of ``THREADS_AGENTS`` (loaded into ``registry`` to hash them)."""
    if settings.deploy_version != AUTO_VERSION:
        return settings
    if not settings.agents:
        raise ConfigError("THREADS_DEPLOY_VERSION=auto derives the version from THREADS_AGENTS, which is not set")
    registry.load(settings.agents)
    return settings.with_(deploy_version=derive_version({a.name: a.config_hash() for a in registry}))


def serve_metrics(store: Store) -> None:
    """Serve Prometheus metrics on THREADS_METRICS_PORT, when it is set (see threads_celery.telemetry.metrics)."""
    raw = os.environ.get(METRICS_PORT_VARIABLE, "").strip()
    if not raw:
        return
    if not raw.isdigit() or not 0 < int(raw) < 65536:
        raise ConfigError(f"{METRICS_PORT_VARIABLE} must be a port number, not {raw!r}")
    try:
        serve(store, int(raw))
    except ImportError:
        raise ConfigError(
            f"{METRICS_PORT_VARIABLE} needs prometheus-client: pip install 'threads-celery[metrics]'"
        ) from None
    except OSError as exc:
        raise ConfigError(f"{METRICS_PORT_VARIABLE}={raw}: cannot listen: {exc}") from None


def app_from_environment() -> ThreadsCelery:
    """The app of ``celery -A threads_celery.worker`` (and ``-A tasks``): settings and agents from
    ``THREADS_*`` variables.

    A worker or Beat started from it runs :func:`preflight` first and refuses to start, with one
    line on stderr and exit status 2, when it fails.
    """
    settings = Settings.from_env()
    if not settings.broker_url:
        raise ConfigError("THREADS_BROKER_URL is not set (e.g. redis://127.0.0.1:6379/0)")
    registry = AgentRegistry()
    settings = resolve_deploy_version(settings, registry)
    app = create_app(settings, registry)
    connect_service_signals(app, settings)
    return app


def connect_service_signals(app: Celery, settings: Settings) -> None:
    """What a worker or Beat of ``app`` does at start: consume the control queue, capture a
    tool's output for redaction, run :func:`preflight` (refusing to start, in one line, when it
    fails) and record the agents it loaded; Beat's preflight is ``app.threads_beat_preflight``."""

    @celeryd_after_setup.connect(weak=False)
    def _consume_control(sender: str, instance: Any, **_: Any) -> None:
        consume_control_queue(instance.app)
        pool = getattr(instance, "pool_cls", None)
        if settings.capture_output and isinstance(pool, type) and not issubclass(pool, PreforkPool):
            # solo, threads, gevent: tools run in this very process
            output_capture.capture_output()

    # A pool process's fds 1 and 2 (os.write, subprocesses of a tool) go through redaction.
    @worker_process_init.connect(weak=False)
    def _capture_pool_output(**_: Any) -> None:
        if settings.capture_output:
            output_capture.capture_output()
        if gc.get_freeze_count():  # the parent settled its heap: settle what this process's start-up made
            settle_heap()

    @worker_process_shutdown.connect(weak=False)
    def _release_pool_output(**_: Any) -> None:
        output_capture.release_output()

    @worker_init.connect(weak=False)
    def _check_worker(sender: Any = None, **_: Any) -> None:
        # Signals are process-wide: answer only for a worker of this app.
        if getattr(sender, "app", None) is not app:
            return
        quiet_ticks.install()
        with exit_on_failure("worker"):
            preflight(app, service="worker")
            runtime = runtime_holder(app).get()
            serve_metrics(runtime.store)
            for agent in runtime.registry:
                with runtime.store.transaction() as tx:
                    tx.upsert_agent(agent.name, agent.config_hash(), agent.describe(), utcnow())
            if runtime.deploy_version is not None:
                deploy_heartbeat.start(runtime, runtime.deploy_version, settings.deploy_heartbeat_s)
        # Before a prefork pool forks: its processes share these pages, never walked again. Not
        # in an embedded worker: the process is the user's, and so is the choice of freezing it.
        if not getattr(sender, "threads_embedded", False):
            settle_heap()

    def _check_beat() -> None:
        with exit_on_failure("beat"):
            preflight(app, service="beat")

    # Called by threads_celery.worker.beat.Scheduler before it reads the schedules (before Celery's
    # logging takes stderr over), so a refusal is one line and not a logged traceback.
    app.threads_beat_preflight = _check_beat  # type: ignore[attr-defined]  # declared on ThreadsCelery only
