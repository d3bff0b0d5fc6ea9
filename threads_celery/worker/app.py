"""The Celery side: configuration, the three tasks, and the outbox publisher.

The broker is a doorbell: task messages carry ids only (a run id and step number, or an effect
key). Delivery is at-least-once (``acks_late``, ``reject_on_worker_lost``, prefetch 1) and every
task reads the ledger first, so a duplicate or late delivery does nothing.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from celery import Celery, Task
from kombu import Exchange, Queue
from kombu.exceptions import OperationalError as KombuOperationalError

from threads_celery.celery_settings import merge_celery_settings
from threads_celery.decisions.backbone import (
    CONTROL_TASKS,
    DELIVER_TASK,
    RECONCILE_TASK,
    SCHEDULED_RUN_TASK,
    WORK_PRIORITY,
    WORK_QUEUE,
    control_queue_for,
    message_priority,
    queue_for,
    tick_is_covered,
)
from threads_celery.definitions.agents import AgentRegistry
from threads_celery.exceptions import BrokerUnavailable, ConfigError, FenceLost, StoreUnavailable
from threads_celery.records import OutboxEntry
from threads_celery.runtime.preflight import Ready, check_database, check_models, exit_on_failure, require_database_url
from threads_celery.settings import Settings
from threads_celery.store import Store, create_store_engine, parse_database_url
from threads_celery.transitions.runs import STEP_TASK, TOOL_TASK, utcnow

if TYPE_CHECKING:
    from threads_celery.runtime.machine import Runtime

log = logging.getLogger("threads_celery.worker.app")

EMBEDDED_BROKER = "memory://"


def task_queue(name: str) -> Queue:
    """A queue bound to a direct exchange of its own name, by its own name.

    Celery gives a bare ``Queue(name)`` its default exchange and routing key (``threads``): two
    queues declared that way are both bound to key ``threads``, and a control message would be
    copied into the work queue as well.
    """
    return Queue(name, Exchange(name, type="direct"), routing_key=name)


def celery_config(settings: Settings, broker_url: str) -> dict[str, Any]:
    """Celery settings for at-least-once, JSON-only delivery of id-only task messages.

    Two queues: work (``threads``: model steps and tool calls, unless an agent or tool names
    its own) and control (``threads.control``: reconcile ticks, finish deliveries, scheduled-run
    starts), so that the backbone never waits behind a backlog of work.
    """
    work_queue = WORK_QUEUE
    if broker_url.startswith("memory://"):
        # The memory transport's queues are shared by the whole process: queues of our own keep
        # two embedded runtimes (or a stopping one) from taking each other's tasks.
        work_queue = f"threads-embedded-{uuid.uuid4().hex[:12]}"
    config: dict[str, Any] = {
        "broker_url": broker_url,
        "broker_connection_retry_on_startup": True,
        "broker_transport_options": {"visibility_timeout": settings.visibility_timeout_s},
        "task_serializer": "json",
        "accept_content": ["json"],
        "result_serializer": "json",
        "result_backend": None,
        "task_ignore_result": True,
        "task_acks_late": True,
        "task_reject_on_worker_lost": True,
        "worker_prefetch_multiplier": 1,
        "task_time_limit": settings.task_time_limit_s,
        "task_soft_time_limit": settings.task_soft_time_limit_s,
        "task_track_started": False,
        "worker_send_task_events": True,
        "task_send_sent_event": True,
        "task_default_queue": work_queue,
        # A worker started without -Q consumes both; one started with -Q gets the control queue
        # added (see consume_control_queue).
        "task_queues": (task_queue(work_queue), task_queue(control_queue_for(work_queue))),
        "task_routes": {task: {"queue": control_queue_for(work_queue)} for task in sorted(CONTROL_TASKS)},
        "worker_hijack_root_logger": False,
        # Beat's scheduler adds the scheduled batch agents (SCHEDULES in THREADS_AGENTS modules)
        # and publishes each with its slot: see beat/schedule.py and threads_celery.runtime.schedules.
        "beat_scheduler": "beat.schedule:Scheduler",
        "beat_schedule": {
            "threads-reconcile": {
                "task": RECONCILE_TASK,
                "schedule": timedelta(seconds=settings.reconcile_interval_s),
                # No ``expires``: a tick late behind anything still runs, unless a tick that started
                # after it was published covered it (see threads_celery.decisions.backbone.tick_is_covered).
                "options": {"queue": control_queue_for(work_queue)},
            }
        },
    }
    if message_priority(STEP_TASK, recovered=False, broker_url=broker_url) is not None:
        # What Celery sends itself (a task's retry) queues as ordinary work, behind recoveries;
        # the control tasks carry their own priority (see install_tasks).
        config["task_default_priority"] = WORK_PRIORITY
    if broker_url.startswith("memory://"):
        # The memory transport polls; a short interval keeps each hop near a few milliseconds.
        config["broker_transport_options"] = {"polling_interval": 0.005}
        config["task_send_sent_event"] = False
        config["worker_send_task_events"] = False
    return merge_celery_settings(config, settings.extra_celery)


class Publisher:
    """Publishes outbox entries after their transaction committed.

    A failure here loses nothing: the row stays in the outbox and the reconcile backbone
    publishes it again.
    """

    def __init__(self, app: Celery, *, single_queue: str | None = None) -> None:
        self.app = app
        # The embedded worker consumes one work queue: all work goes there, whatever its routing.
        self.single_queue = single_queue
        self.broker_url = str(app.conf.broker_url or "")
        self.control_queue = control_queue_for(app.conf.task_default_queue or WORK_QUEUE)

    def __call__(self, entries: Sequence[OutboxEntry]) -> None:
        for entry in entries:
            try:
                self.send(entry)
            except Exception as exc:  # noqa: BLE001 - the outbox row is the retry
                log.warning("publish of %s failed, left for the reconcile backbone: %s", entry.key, exc)

    def send(self, entry: OutboxEntry) -> None:
        options: dict[str, Any] = {"task_id": entry.key, "argsrepr": entry.argsrepr or entry.key}
        queue = queue_for(entry.task, entry.queue, work_queue=self.single_queue, control_queue=self.control_queue)
        if queue:
            options["queue"] = queue
        priority = message_priority(entry.task, recovered=entry.recovered, broker_url=self.broker_url)
        if priority is not None:
            options["priority"] = priority
        self.app.send_task(
            entry.task,
            args=list(entry.args),
            retry=True,
            retry_policy={"max_retries": 2, "interval_start": 0.1, "interval_step": 0.2},
            **options,
        )

    def check(self, timeout: float = 3.0) -> None:
        """Raise BrokerUnavailable unless the broker accepts a connection."""
        try:
            with self.app.connection_for_write() as conn:
                # kombu takes float seconds here; celery-types annotates the timeout as int.
                conn.ensure_connection(max_retries=1, timeout=timeout)  # type: ignore[arg-type]
        except (KombuOperationalError, OSError, TimeoutError) as exc:
            raise BrokerUnavailable(
                f"cannot reach the broker at {safe_broker_url(self.app.conf.broker_url)}: {exc}"
            ) from exc


def safe_broker_url(url: str | None) -> str:
    if not url:
        return "<unset>"
    from kombu.utils.url import maybe_sanitize_url

    return str(maybe_sanitize_url(url))


def open_store(database_url: str, settings: Settings | None = None, **engine_options: Any) -> Store:
    url = parse_database_url(database_url, source="THREADS_DATABASE_URL")
    settings = settings or Settings()
    return Store(
        create_store_engine(url, **engine_options),
        step_grace_s=settings.outbox_stale_after_s,
        tool_grace_s=settings.tool_lease_s,
    )


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
        from threads_celery.runtime.schedules import ScheduleRegistry

        self.schedules = ScheduleRegistry()

    def get(self) -> Runtime:
        """This process's runtime, built on first use (and again after a fork)."""
        from threads_celery.runtime.machine import Runtime

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
            return self._runtime


class ThreadsCelery(Celery):
    """A Celery app that carries the runtime its tasks use, as ``app.threads_runtime``."""

    threads_runtime: RuntimeHolder
    #: Beat's start-up check (see beat.schedule.Scheduler); None for apps that are not services.
    threads_beat_preflight: Callable[[], None] | None = None


def create_app(
    settings: Settings,
    registry: AgentRegistry,
    *,
    broker_url: str | None = None,
    store: Store | None = None,
    main: str = "threads",
) -> ThreadsCelery:
    """A Celery app with the threads tasks installed, bound to ``registry`` and the store."""
    broker = broker_url or settings.broker_url or EMBEDDED_BROKER
    app = ThreadsCelery(main, set_as_current=False)
    app.conf.update(celery_config(settings, broker))
    holder = RuntimeHolder(app, settings, registry, store)
    if broker.startswith("memory://"):
        holder.single_queue = app.conf.task_default_queue
    app.threads_runtime = holder
    install_tasks(app, holder)
    return app


def install_tasks(app: Celery, holder: RuntimeHolder) -> None:
    """Register ``threads.step``, ``threads.tool`` and ``threads.reconcile`` on ``app``."""
    # Control tasks go ahead of all work on Redis, however they are sent (Beat, a retry).
    control_priority = message_priority(RECONCILE_TASK, recovered=False, broker_url=str(app.conf.broker_url or ""))

    # The bound tasks' ``self`` is the Task the decorator builds; its call signature is Any there.
    def _run(task: Task[Any, Any], work: Callable[[], str], poison_key: str | None = None) -> str:
        # Imported here, not above: a web app builds this app too, and must not load the runtime
        # (and with it the model layer) just to publish tasks.
        from threads_celery.runtime.machine import RetryLater

        try:
            return work()
        except RetryLater as exc:
            raise task.retry(countdown=exc.countdown, max_retries=None, exc=None) from None
        except FenceLost as exc:
            log.info("%s: %s", task.name, exc)
            return "fence lost"
        except StoreUnavailable as exc:
            countdown = min(2**task.request.retries, 30)
            log.warning("%s: store unavailable, retrying in %ss: %s", task.name, countdown, exc)
            raise task.retry(countdown=countdown, max_retries=None, exc=None) from None
        except Exception as exc:
            if poison_key is None:
                raise
            # A step or tool task that fails unforeseen: bounded tries, then the run ends.
            from threads_celery.decisions.retry import GiveUp
            from threads_celery.runtime.failures import apply_task_failure

            failures = (task.request.retries or 0) + 1
            decision = apply_task_failure(holder.get(), task.name, poison_key, failures, exc)
            if isinstance(decision, GiveUp):
                return f"gave up: {decision.reason}"
            raise task.retry(countdown=decision.countdown, max_retries=None, exc=None) from None

    @app.task(name=STEP_TASK, bind=True, shared=False, acks_late=True, reject_on_worker_lost=True)
    def step(self: Task[Any, Any], run_id: str, n: int) -> str:
        """Run one model step of a run."""
        runtime = holder.get()
        return _run(self, lambda: runtime.run_step(run_id, n, attempt=self.request.retries or 0), run_id)

    @app.task(name=TOOL_TASK, bind=True, shared=False, acks_late=True, reject_on_worker_lost=True)
    def tool(self: Task[Any, Any], effect_key: str) -> str:
        """Run one tool call, by effect key."""
        runtime = holder.get()
        return _run(self, lambda: runtime.run_tool(effect_key), effect_key)

    @app.task(
        name=DELIVER_TASK,
        bind=True,
        shared=False,
        priority=control_priority,
        acks_late=True,
        reject_on_worker_lost=True,
    )
    def deliver(self: Task[Any, Any], run_id: str, status: str) -> str:
        """Deliver an agent-tool run's finish: the parent's tool result, on_finish or notify."""
        runtime = holder.get()
        return _run(self, lambda: runtime.deliver(run_id, status))

    @app.task(name=RECONCILE_TASK, bind=True, shared=False, priority=control_priority, acks_late=False)
    def reconcile(self: Task[Any, Any], published_at: float | None = None) -> str:
        """Beat's backbone tick: re-dispatch runs whose worker died, republish lost outbox rows.

        ``published_at`` (Beat's clock) lets a tick that waited in the queue see that a later
        tick already swept everything it would; it is then skipped, never discarded unseen.
        """
        if tick_is_covered(published_at, holder.last_tick_started_at):
            return "covered by a later tick"
        runtime = holder.get()
        holder.last_tick_started_at = time.time()
        from threads_celery.telemetry.metrics import timed_tick

        with timed_tick():
            return _run(self, lambda: str(runtime.reconcile_tick()))

    @app.task(
        name=SCHEDULED_RUN_TASK,
        bind=True,
        shared=False,
        priority=control_priority,
        acks_late=True,
        reject_on_worker_lost=True,
    )
    def scheduled_run(self: Task[Any, Any], schedule_name: str, slot_iso: str | None = None) -> str:
        """Start the run of one slot of a schedule (Beat publishes it); idempotent by slot."""
        from threads_celery.runtime.schedules import start_scheduled_run

        runtime = holder.get()
        return _run(self, lambda: start_scheduled_run(runtime, holder.schedules, schedule_name, slot_iso))


def preflight(app: ThreadsCelery, *, service: str) -> Ready:
    """Check that ``app`` can work before it accepts any: the database is set, answers and is at
    head, the agents of ``THREADS_AGENTS`` import, and their model providers can be built.

    Raises the ThreadsError whose message says what is wrong (see :mod:`threads_celery.runtime.preflight`).
    """
    holder = app.threads_runtime
    if holder._store is None:
        require_database_url(holder.settings.database_url, service=service)
    runtime = holder.get()
    revision = check_database(runtime.store)
    check_models(runtime.registry)
    return Ready(revision=revision, agents=tuple(agent.name for agent in runtime.registry))


def consume_control_queue(app: Celery) -> None:
    """Make a worker consume the control queue besides the queues it was given (``-Q``).

    A worker started with ``-Q email`` for slow tools still takes reconcile ticks and finish
    deliveries, so recovery never depends on one particular worker being alive.
    """
    control = control_queue_for(app.conf.task_default_queue or WORK_QUEUE)
    if control not in app.amqp.queues.consume_from:
        app.amqp.queues.select_add(task_queue(control))


def serve_metrics(store: Store) -> None:
    """Serve Prometheus metrics on THREADS_METRICS_PORT, when it is set (see threads_celery.telemetry.metrics)."""
    from threads_celery.telemetry.metrics import METRICS_PORT_VARIABLE, serve

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
    """The worker app for ``celery -A tasks``: settings and agents from ``THREADS_*`` variables.

    A worker or Beat started from it runs :func:`preflight` first and refuses to start, with one
    line on stderr and exit status 2, when it fails.
    """
    settings = Settings.from_env()
    if not settings.broker_url:
        raise ConfigError("THREADS_BROKER_URL is not set (e.g. redis://127.0.0.1:6379/0)")
    registry = AgentRegistry()
    app = create_app(settings, registry)

    from celery.signals import celeryd_after_setup, worker_init

    @celeryd_after_setup.connect(weak=False)
    def _consume_control(sender: str, instance: Any, **_: Any) -> None:
        consume_control_queue(instance.app)

    @worker_init.connect(weak=False)
    def _check_worker(sender: Any = None, **_: Any) -> None:
        # Signals are process-wide: answer only for a worker of this app.
        if getattr(sender, "app", None) is not app:
            return
        with exit_on_failure("worker"):
            preflight(app, service="worker")
            runtime = app.threads_runtime.get()
            serve_metrics(runtime.store)
            for agent in runtime.registry:
                with runtime.store.transaction() as tx:
                    tx.upsert_agent(agent.name, agent.config_hash(), agent.describe(), utcnow())

    def _check_beat() -> None:
        with exit_on_failure("beat"):
            preflight(app, service="beat")

    # Called by beat.schedule.Scheduler before it reads the schedules (before Celery's logging
    # takes stderr over), so a refusal is one line and not a logged traceback.
    app.threads_beat_preflight = _check_beat
    return app
