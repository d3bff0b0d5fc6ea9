"""The doorbell: what the client and the workers share to send tasks, and nothing that runs them.

The broker only rings the bell: task messages carry ids (a run id and step number, or an effect
key), and the ledger holds everything else. Delivery is at-least-once (``acks_late``,
``reject_on_worker_lost``, prefetch 1) and every task reads the ledger first, so a duplicate or
late delivery does nothing.

This module builds a configured Celery app with no tasks installed (:func:`celery_app`), publishes
committed outbox entries on it (:class:`Publisher`) and opens the ledger (:func:`open_store`). A
web app imports it through :class:`threads_celery.client.Threads` and loads no worker code; the
workers install their tasks on such an app (:mod:`threads_celery.worker.application`).
"""

from __future__ import annotations

import logging
import re
import secrets
import time
import uuid
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any, TypeVar

from celery import Celery
from kombu import Exchange, Queue
from kombu.exceptions import OperationalError as KombuOperationalError
from kombu.utils.url import maybe_sanitize_url

from threads_celery.celery_settings import merge_celery_settings
from threads_celery.decisions.backbone import (
    CONTROL_TASKS,
    RECONCILE_TASK,
    RETENTION_TASK,
    WORK_PRIORITY,
    WORK_QUEUE,
    control_queue_for,
    message_priority,
    queue_for,
)
from threads_celery.decisions.deploys import AUTO_VERSION, version_of_queue, versioned_queue
from threads_celery.exceptions import BrokerUnavailable
from threads_celery.records import OutboxEntry
from threads_celery.settings import Settings
from threads_celery.store import Store, create_store_engine, parse_database_url
from threads_celery.transitions import held_producers
from threads_celery.transitions.held_producers import ProducerStack
from threads_celery.transitions.runs import STEP_TASK, TOOL_TASK

log = logging.getLogger("threads_celery.transitions.publishing")

#: The tasks of a run's own work, which a deployment version's queues carry.
VERSIONED_TASKS = frozenset({STEP_TASK, TOOL_TASK, "threads.upgrade"})

#: The broker of the embedded default: Celery's in-process memory transport.
EMBEDDED_BROKER = "memory://"

#: Where Beat finds its scheduler (the reconcile backbone plus the declared schedules).
BEAT_SCHEDULER = "threads_celery.worker.beat:Scheduler"

AppT = TypeVar("AppT", bound=Celery)


#: Seconds a Redis broker connection may take to connect (kombu's default waits for the kernel).
REDIS_CONNECT_TIMEOUT_S = 5
#: Seconds a Redis command may wait for its answer (kombu's default waits for ever).
REDIS_SOCKET_TIMEOUT_S = 10


def worker_version(settings: Settings, broker_url: str) -> str | None:
    """The deployment version whose queues an app of ``settings`` consumes, or None: versions not
    in use, still to be derived (``auto``: see threads_celery.worker.application), or the
    embedded worker, which is one process and one version by construction."""
    version = settings.deploy_version
    if version is None or version == AUTO_VERSION or broker_url.startswith("memory://"):
        return None
    return version


#: The setting a versioned app keeps its deployment version in.
DEPLOY_VERSION_SETTING = "threads_deploy_version"

#: URL schemes of RabbitMQ (py-amqp and librabbitmq transports).
RABBITMQ_SCHEMES = ("amqp://", "amqps://", "pyamqp://", "librabbitmq://")


def is_rabbitmq(broker_url: str) -> bool:
    """Whether ``broker_url`` (or the first of a failover list) is a RabbitMQ broker."""
    return broker_url.split(";", 1)[0].strip().startswith(RABBITMQ_SCHEMES)


def task_queue(name: str, *, quorum: bool = False) -> Queue:
    """A queue bound to an exchange of its own name, by its own name.

    Celery gives a bare ``Queue(name)`` its default exchange and routing key (``threads``): two
    queues declared that way are both bound to key ``threads``, and a control message would be
    copied into the work queue as well. ``quorum``: a RabbitMQ quorum queue (replicated, durable,
    its messages kept through a broker restart), on a topic exchange, which Celery's native
    delayed delivery (a retry's countdown held by the broker, not by a worker) needs; a routing
    key without wildcards matches only itself there, as on a direct exchange.
    """
    if quorum:
        return Queue(name, Exchange(name, type="topic"), routing_key=name, queue_arguments={"x-queue-type": "quorum"})
    return Queue(name, Exchange(name, type="direct"), routing_key=name)


def _control_route(queue: str, broker_url: str) -> dict[str, Any]:
    route: dict[str, Any] = {"queue": queue}
    priority = message_priority(RECONCILE_TASK, recovered=False, broker_url=broker_url)
    if priority is not None:
        route["priority"] = priority
    return route


# A step's and a call's argsrepr begin with the agent's or the tool's name, as repr() writes it.
_NAMED_ARGSREPR = re.compile(r"""\((?P<quote>['"])(?P<name>[^'"\\]{1,200})(?P=quote)""")


def shadow_name(entry: OutboxEntry) -> str | None:
    """The name a step or tool task shows in Flower, ``celery inspect`` and the worker's log:
    ``threads.step trip-planner``, ``threads.tool send_email`` (Celery's shadow name; the task
    that runs is the same). None for the control tasks and for an entry without its name."""
    if entry.task not in (STEP_TASK, TOOL_TASK) or not entry.argsrepr:
        return None
    named = _NAMED_ARGSREPR.match(entry.argsrepr)
    return f"{entry.task} {named['name']}" if named else None


#: What separates a tool task's id from the call's effect key.
TASK_ID_SEPARATOR = "~"


def task_id(entry: OutboxEntry) -> str:
    """The Celery task id of one publish of ``entry``.

    A step's, a delivery's: the entry's key (``step:<run>:<n>``), the same on every publish. A
    tool call's: its effect key and a token of this publish (``<effect key>~3f9a0c1e``), because a
    call is published more than once by design: it waits for an approval, a variable or a person's
    decision and is published again when it is answered. Under one id, monitors that key tasks by
    id (Flower) would show only the last attempt, and the attempt that waited would vanish under
    the one that ran. Nothing reads the id back: a call is found by its effect key (the task's
    argument), and its idempotency is the ledger's, by effect key.
    """
    if entry.task != TOOL_TASK:
        return entry.key
    return f"{entry.key}{TASK_ID_SEPARATOR}{secrets.token_hex(4)}"


#: Where Beat keeps its schedule state unless told (``--schedule``), relative to its working directory.
BEAT_SCHEDULE_FILE = ".threads-celery/celerybeat-schedule"


def celery_config(settings: Settings, broker_url: str) -> dict[str, Any]:
    """Celery settings for at-least-once, JSON-only delivery of id-only task messages.

    Two queues: work (``threads``: model steps and tool calls, unless an agent or tool names
    its own) and control (``threads.control``: reconcile ticks, finish deliveries, scheduled-run
    starts), so that the backbone never waits behind a backlog of work.
    """
    work_queue = WORK_QUEUE
    quorum = is_rabbitmq(broker_url) and settings.rabbitmq_queue_type == "quorum"
    if broker_url.startswith("memory://"):
        # The memory transport's queues are shared by the whole process: queues of our own keep
        # two embedded runtimes (or a stopping one) from taking each other's tasks.
        work_queue = f"threads-embedded-{uuid.uuid4().hex[:12]}"
    version = worker_version(settings, broker_url)
    if version is not None:
        # A worker of version V takes the work of the runs on V (threads@V), the work of runs on
        # no version yet (threads: a new run's first step, a run from before versions), and the
        # shared control queue. See threads_celery.decisions.deploys.
        work_queue = versioned_queue(WORK_QUEUE, version) or WORK_QUEUE
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
        # Task events cost a publish each (task-sent, received, started, succeeded): opt-in
        # (THREADS_TASK_EVENTS). Flower enables the workers' events itself while it runs, and
        # `celery worker -E` or `celery control enable_events` do too.
        "worker_send_task_events": settings.task_events,
        "task_send_sent_event": settings.task_events,
        "task_default_queue": work_queue,
        # Beat's memory of the slots it has published, next to the embedded store: in the working
        # directory, where a restart finds it (not under /tmp), and never a stray file in a checkout.
        "beat_schedule_filename": BEAT_SCHEDULE_FILE,
        # A worker started without -Q consumes both; one started with -Q gets the control queue
        # added (see threads_celery.worker.application.consume_control_queue).
        "task_queues": (
            task_queue(work_queue, quorum=quorum),
            task_queue(control_queue_for(work_queue), quorum=quorum),
            *((task_queue(WORK_QUEUE, quorum=quorum),) if version is not None else ()),
        ),
        # Control tasks go ahead of all work on Redis however they are sent (Beat, a retry): the
        # priority is the route's, a message option, as Celery 6 keeps it (a task's own
        # ``priority`` attribute is deprecated).
        "task_routes": {
            task: _control_route(control_queue_for(work_queue), broker_url) for task in sorted(CONTROL_TASKS)
        },
        "worker_hijack_root_logger": False,
        # Beat's scheduler adds the scheduled batch agents (SCHEDULES in THREADS_AGENTS modules)
        # and publishes each with its slot: see threads_celery.worker.beat and threads_celery.runtime.schedules.
        "beat_scheduler": BEAT_SCHEDULER,
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
    if version is not None:  # the deployment version whose queues this app's workers consume
        config[DEPLOY_VERSION_SETTING] = version
    if settings.retention.enabled:
        # The retention sweep: its first batch; each batch publishes the next (see
        # threads_celery.worker.retention_task), so no task holds a worker for long.
        config["beat_schedule"]["threads-retention"] = {
            "task": RETENTION_TASK,
            "schedule": timedelta(seconds=settings.retention_interval_s),
            "options": {"queue": control_queue_for(work_queue)},
        }
    if message_priority(STEP_TASK, recovered=False, broker_url=broker_url) is not None:
        # What Celery sends itself (a task's retry) queues as ordinary work, behind recoveries;
        # the control tasks carry their route's priority.
        config["task_default_priority"] = WORK_PRIORITY
    if broker_url.startswith(("redis://", "rediss://")):
        # A broker behind a broken link (a partition, a host gone) must not hold a publish, and
        # with it an API request, for the kernel's two minutes of connection attempts or its
        # fifteen of retransmissions on a connection that died silently: a publish that cannot
        # connect or be answered within these fails, and its outbox row is left for the backbone.
        # (The consumer's BRPOP waits one second at a time: well inside the socket timeout.)
        config["broker_transport_options"] = {
            **config["broker_transport_options"],
            "socket_connect_timeout": REDIS_CONNECT_TIMEOUT_S,
            "socket_timeout": REDIS_SOCKET_TIMEOUT_S,
        }
    if is_rabbitmq(broker_url):
        # RabbitMQ as production runs it: the broker confirms each publish (a publish it did not
        # take raises, and the outbox row stays for the backbone to publish again), and
        # THREADS_RABBITMQ_QUEUE_TYPE=quorum (the default) declares quorum queues, the queues
        # agents and tools name included, so that a broker restart loses no message. Celery
        # turns global QoS off for quorum queues itself (worker_detect_quorum_queues; the
        # prefetch stays 1 per consumer) and holds a retry's countdown in the broker (native
        # delayed delivery, on the topic exchanges of task_queue).
        config["broker_transport_options"] = {**config["broker_transport_options"], "confirm_publish": True}
        if quorum:
            config["task_create_missing_queue_type"] = "quorum"
            config["task_create_missing_queue_exchange_type"] = "topic"
    if broker_url.startswith("memory://"):
        # The memory transport polls; a short interval keeps each hop near a few milliseconds.
        config["broker_transport_options"] = {"polling_interval": 0.005}
        config["task_send_sent_event"] = False
        config["worker_send_task_events"] = False
    return merge_celery_settings(config, settings.extra_celery)


def celery_app(
    settings: Settings,
    *,
    broker_url: str | None = None,
    main: str = "threads",
    app_class: type[AppT] = Celery,  # type: ignore[assignment]  # mypy cannot tie a TypeVar default to its bound
) -> AppT:
    """A Celery app configured by :func:`celery_config`, with no tasks installed.

    ``broker_url`` defaults to the settings' broker, then to the embedded memory transport. The
    app is not made the process's current app: a process may hold several.
    """
    broker = broker_url or settings.broker_url or EMBEDDED_BROKER
    app = app_class(main, set_as_current=False)
    app.conf.update(celery_config(settings, broker))
    return app


#: How long a publish or a check that reached the broker vouches for it: within it,
#: :meth:`Publisher.ensure_reachable` opens no connection of its own.
REACHABLE_FOR_S = 1.0

#: How long a check that could not reach the broker answers for it: within it,
#: :meth:`Publisher.ensure_reachable` raises that check's error at once instead of waiting for
#: another connection to time out (seconds each), so callers hear of an outage without queueing.
UNREACHABLE_FOR_S = 1.0


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
        self.control_queue = control_queue_for(work_queue_of(app))
        self.version = None if single_queue is not None else deploy_version_of(app)
        # On plain Redis, producers of our own that keep one Redis client each (see held_producers).
        self._producers = ProducerStack(app) if held_producers.serves(self.broker_url) else None
        # Nor do they declare the queue on every send (a copy and bind of it each time, a fifth of
        # what is left of a publish): routed by queue name, work goes to the default exchange, by
        # which kombu's Redis transport pushes onto the queue's list by name, declared or not. A
        # route of the user's that names an exchange keeps Celery's declaring.
        self._declare: dict[str, Any] = {"declare": []} if routes_by_queue_only(app) else {}
        # Routes of those sends by (task, queue, priority): static when routed by queue name.
        self._routes: dict[tuple[str, str | None, int | None], dict[str, Any]] = {}
        self._sent_events = bool(app.conf.task_send_sent_event)
        # Until when (time.monotonic) the last publish or check that reached the broker vouches
        # for it; a failed one ends it at once.
        self._reachable_until = 0.0
        # Until when the last failed check answers for the broker, and what it said.
        self._unreachable_until = 0.0
        self._unreachable: BrokerUnavailable | None = None

    def __call__(self, entries: Sequence[OutboxEntry]) -> None:
        """Publish ``entries``; one that fails is logged and left in the outbox for the backbone."""
        send_one: Callable[[OutboxEntry], None] = self.send
        if self._producers is not None:
            if not entries or self._send_held(entries):
                return
            send_one = self._send_pooled  # the batch failed: again through Celery's pool, retrying
        for entry in entries:
            try:
                send_one(entry)
            except Exception as exc:  # noqa: BLE001 - the outbox row is the retry
                self._reachable_until = 0.0
                log.warning("publish of %s failed, left for the reconcile backbone: %s", entry.key, exc)

    def send(self, entry: OutboxEntry) -> None:
        """Publish one entry now, raising what the broker's refusal raised."""
        if self._producers is None or not self._send_held([entry]):
            self._send_pooled(entry)

    def _send_pooled(self, entry: OutboxEntry) -> None:
        """Through Celery's own producer pool, with its retries."""
        if self._declare:
            with self.app.producer_or_acquire() as producer:
                self._send_messages(producer, [entry], declare=None)
        else:
            self._send_task(entry, self._options(entry))
        self._reachable_until = time.monotonic() + REACHABLE_FOR_S

    def _options(self, entry: OutboxEntry) -> dict[str, Any]:
        options: dict[str, Any] = {"task_id": task_id(entry), "argsrepr": entry.argsrepr or entry.key}
        shadow = shadow_name(entry)
        if shadow is not None:
            options["shadow"] = shadow
        queue, priority = self._destination(entry)
        if queue:
            options["queue"] = queue
        if priority is not None:
            options["priority"] = priority
        return options

    def _destination(self, entry: OutboxEntry) -> tuple[str | None, int | None]:
        """The queue ``entry`` goes to (None: by its route) and its message priority."""
        if entry.user_task:  # the project's task: its own queue, else the app's routes
            return entry.queue, None
        queue = queue_for(entry.task, entry.queue, work_queue=self.single_queue, control_queue=self.control_queue)
        if self.version is not None and queue and version_of_queue(queue) is None and entry.task in VERSIONED_TASKS:
            # A versioned worker's follow-up work on a queue an agent or tool names stays with its
            # version (``email`` -> ``email@v2``); work on no named queue takes the app's default,
            # ``threads@v2``. A run on another version is routed there by the worker that takes it.
            queue = versioned_queue(queue, self.version)
        return queue, message_priority(entry.task, recovered=entry.recovered, broker_url=self.broker_url)

    def _send_held(self, entries: Sequence[OutboxEntry]) -> bool:
        """Send ``entries`` on a held producer, in one round trip (kombu's publish batch: the
        task messages and their task-sent events go in one pipeline). False if that failed:
        the producer is dropped, and the caller sends them again through Celery's own pool,
        with its retries (a batch that failed midway may have delivered some: a task delivered
        twice reads the ledger and does nothing the second time)."""
        assert self._producers is not None
        held = self._producers.take()
        try:
            with held[1].batch():  # type: ignore[attr-defined]  # kombu 5.7's; not in its stubs yet
                if self._declare:
                    self._send_messages(held[1], entries, declare=[])
                else:
                    for entry in entries:
                        self._send_task(entry, {**self._options(entry), "producer": held[1]})
        except Exception as exc:  # noqa: BLE001 - sent again, one by one, by the caller
            self._producers.discard(held)
            self._reachable_until = 0.0
            log.info("batched publish of %d task(s) failed, sending them one by one: %s", len(entries), exc)
            return False
        except BaseException:
            self._producers.discard(held)
            raise
        self._producers.give_back(held)
        self._reachable_until = time.monotonic() + REACHABLE_FOR_S
        return True

    def _send_messages(self, producer: Any, entries: Sequence[OutboxEntry], declare: list[Any] | None) -> None:
        """Send ``entries`` on ``producer`` as the task messages ``send_task`` would, built and
        sent by Celery's own ``create_task_message`` and ``send_task_message`` (the publish
        signals and the ``task-sent`` event included). ``declare`` None declares the queue as
        Celery does (kombu declares it once per connection); ``[]`` declares nothing.

        Routed by queue name only, so each route is worked out once and kept. Left out is what
        ``send_task`` adds around them that these sends never use: a result object (results are
        ignored), the task's registered options (ours set none that a message carries) and the
        repr of empty keyword arguments. About a third of a publish's CPU (``bench/RESULTS.md``).
        """
        amqp = self.app.amqp
        parent = self.app.current_worker_task
        parent_id = root_id = None
        if parent is not None:  # the task publishing these is their parent, as with send_task
            parent_id = parent.request.id
            root_id = parent.request.root_id or parent_id
        reply_to = self.app.thread_oid
        for entry in entries:
            queue, priority = self._destination(entry)
            route = self._routes.get((entry.task, queue, priority))
            if route is None:
                explicit = {k: v for k, v in (("queue", queue), ("priority", priority)) if v is not None}
                route = self._routes[(entry.task, queue, priority)] = amqp.router.route(
                    explicit, entry.task, (), {}, None
                )
            argsrepr = entry.argsrepr or entry.key
            message = amqp.create_task_message(
                task_id(entry), entry.task, list(entry.args), entry.kwargs or {},
                reply_to=reply_to, create_sent_event=self._sent_events, root_id=root_id, parent_id=parent_id,
                shadow=shadow_name(entry), ignore_result=None, argsrepr=argsrepr, kwargsrepr=repr(entry.kwargs or {}),
            )  # fmt: skip
            # argsrepr also among the properties, as send_task leaves it: the same message.
            amqp.send_task_message(
                producer, entry.task, message, **route, declare=declare, argsrepr=argsrepr,
                retry=True, retry_policy={"max_retries": 2, "interval_start": 0.1, "interval_step": 0.2},
            )  # fmt: skip

    def _send_task(self, entry: OutboxEntry, options: dict[str, Any]) -> None:
        self.app.send_task(
            entry.task,
            args=list(entry.args),
            kwargs=entry.kwargs or None,
            retry=True,
            retry_policy={"max_retries": 2, "interval_start": 0.1, "interval_step": 0.2},
            **options,
        )

    def close(self) -> None:
        """Close the connections this publisher's own producers hold (none but on Redis)."""
        if self._producers is not None:
            self._producers.close()

    def check(self, timeout: float = 3.0) -> None:
        """Raise BrokerUnavailable unless the broker accepts a connection (a new one, now)."""
        self._reachable_until = 0.0
        try:
            with self.app.connection_for_write() as conn:
                # kombu takes float seconds here; celery-types annotates the timeout as int.
                conn.ensure_connection(max_retries=1, timeout=timeout)  # type: ignore[arg-type]
        except (KombuOperationalError, OSError, TimeoutError) as exc:
            unavailable = BrokerUnavailable(
                f"cannot reach the broker at {safe_broker_url(self.app.conf.broker_url)}: {exc}"
            )
            self._unreachable, self._unreachable_until = unavailable, time.monotonic() + UNREACHABLE_FOR_S
            raise unavailable from exc
        self._unreachable_until = 0.0
        self._reachable_until = time.monotonic() + REACHABLE_FOR_S

    def ensure_reachable(self) -> None:
        """:meth:`check`, unless a publish or check reached the broker in the last
        :data:`REACHABLE_FOR_S` seconds and none failed since.

        What ``start()`` asks before it records a run, so that a caller hears of a broker that is
        down instead of a run that waits for the backbone. A broker lost within that second
        is not heard of there: the run's first step stays in the outbox, and the backbone
        publishes it once the broker is back. Opening a connection to ask (about a millisecond
        and a half of a start's five) is paid once a second at most, not on every start.

        A check that failed answers for :data:`UNREACHABLE_FOR_S`: within it the same error is
        raised at once, so that during an outage every start is refused quickly instead of each
        waiting seconds for a connection of its own to time out.
        """
        now = time.monotonic()
        if now < self._reachable_until:
            return
        if self._unreachable is not None and now < self._unreachable_until:
            raise BrokerUnavailable(str(self._unreachable))
        self.check()


def deploy_version_of(app: Celery) -> str | None:
    """The deployment version of ``app``'s workers (None: versions are not in use)."""
    version = app.conf.get(DEPLOY_VERSION_SETTING)
    return str(version) if version else None


#: The setting an app that ``threads_celery.install`` made a threads app keeps its work queue in.
WORK_QUEUE_SETTING = "threads_work_queue"


def work_queue_of(app: Celery) -> str:
    """The queue ``app`` sends agents' work to (``threads`` unless the embedded worker's own):
    its default queue, or on a user's app (``threads_celery.install``), the one it was given."""
    return str(app.conf.get(WORK_QUEUE_SETTING) or app.conf.task_default_queue or WORK_QUEUE)


def routes_by_queue_only(app: Celery) -> bool:
    """Whether every task route of ``app`` names only a queue (and perhaps a priority)."""
    routes = app.conf.task_routes
    if not routes:
        return True
    return isinstance(routes, dict) and all(
        isinstance(route, dict) and set(route) <= {"queue", "priority"} for route in routes.values()
    )


def safe_broker_url(url: str | None) -> str:
    """The broker URL with its password masked, for messages."""
    if not url:
        return "<unset>"
    return str(maybe_sanitize_url(url))


def open_store(database_url: str, settings: Settings | None = None, **engine_options: Any) -> Store:
    """The ledger at ``database_url``, with the leases and graces of ``settings``.

    Here rather than in the store, which knows no Settings (it imports only records and exceptions).
    """
    url = parse_database_url(database_url, source="THREADS_DATABASE_URL")
    settings = settings or Settings()
    return Store(
        create_store_engine(url, **engine_options),
        step_grace_s=settings.outbox_stale_after_s,
        tool_grace_s=settings.tool_lease_s,
        flush_every_commit=settings.flush_every_commit,
    )
