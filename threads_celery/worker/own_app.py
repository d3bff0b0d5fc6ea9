"""The runtime on a Celery app of the user's own (``threads_celery.install(app)``).

A project that already runs Celery (a Django project's ``proj/celery.py``, a FastAPI or Flask
app's) gets the runtime's tasks, queues, routes and Beat entry on its app, configured its way,
so that its workers serve its own tasks and agent runs side by side, and Flower shows both.

The app's settings stay its own, except where the runtime's promises rest on them:

- the runtime's tasks are sent as JSON whatever ``task_serializer`` says (their routes carry
  ``serializer="json"``), and the workers must accept JSON (``accept_content``);
- its tasks are acknowledged late and given back when their worker is lost (set on each task);
- on Redis, the broker's ``visibility_timeout`` must exceed the tasks' hard time limit, or a task
  still running is delivered a second time.

Each is checked here, and a setting that breaks one is a ``ConfigError`` naming it. The work goes
to the ``threads`` queue and the backbone to ``threads.control`` (both added to the app's queues,
beside its default queue), so a worker started without ``-Q`` serves everything and one started
with ``-Q`` for the project's own queues takes the control queue too.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from celery import Celery
from celery.signals import beat_init
from kombu import Queue

from threads_celery.decisions.backbone import CONTROL_TASKS, WORK_QUEUE
from threads_celery.definitions.agents import Agent, AgentRegistry
from threads_celery.exceptions import ConfigError
from threads_celery.settings import Settings
from threads_celery.transitions.publishing import WORK_QUEUE_SETTING, celery_config
from threads_celery.transitions.runs import STEP_TASK, TOOL_TASK
from threads_celery.worker.application import RuntimeHolder, connect_service_signals, install_worker
from threads_celery.worker.beat import Scheduler, plain_beat_entries, schedules_for_app

log = logging.getLogger("celery.beat.threads")


def install(app: Celery, *, agents: Iterable[Agent] = (), settings: Settings | None = None) -> RuntimeHolder:
    """Install the runtime on ``app``, the project's own Celery app.

    ``settings`` default to the ``THREADS_*`` variables (``THREADS_DATABASE_URL``, and
    ``THREADS_AGENTS`` for the agents its workers load); the broker is the app's own. ``agents``
    are registered besides. Call it where the app is made (after ``config_from_object``);
    installing twice changes nothing more. Returns the runtime the tasks use.
    """
    if getattr(app, "threads_runtime", None) is not None:
        installed: RuntimeHolder = app.threads_runtime  # type: ignore[attr-defined]  # set below
        return installed
    settings = settings or Settings.from_env()
    broker = str(app.conf.broker_url or settings.broker_url or "")
    if not broker:
        raise ConfigError("the Celery app has no broker_url (and THREADS_BROKER_URL is not set)")
    settings = settings.with_(broker_url=broker)
    _check_guarantees(app, settings, broker)
    ours = celery_config(settings, broker)

    work = WORK_QUEUE
    app.conf[WORK_QUEUE_SETTING] = work
    declared = list(app.conf.task_queues or ())
    if not declared:  # the app's default queue was implied: keep it consumed beside ours
        declared = [Queue(app.conf.task_default_queue or "celery")]
    names = {q.name for q in declared}
    app.conf.task_queues = tuple(declared) + tuple(q for q in ours["task_queues"] if q.name not in names)

    routes: dict[str, dict[str, Any]] = {task: {"queue": work} for task in (STEP_TASK, TOOL_TASK)}
    routes.update(ours["task_routes"])
    for route in routes.values():
        route["serializer"] = "json"  # whatever the app's own task_serializer
    theirs = app.conf.task_routes
    if not theirs:
        app.conf.task_routes = routes
    else:  # ours first: a catch-all route of the app's must not take the runtime's tasks
        app.conf.task_routes = [routes, *(theirs if isinstance(theirs, (list, tuple)) else [theirs])]

    # The runtime's tasks end inside the broker's redelivery time, whatever the app's own limits.
    # Their results are in the ledger: none goes to the app's result backend.
    limits = {
        "time_limit": settings.task_time_limit_s,
        "soft_time_limit": settings.task_soft_time_limit_s,
        "ignore_result": True,
    }
    annotations: dict[str, dict[str, Any]] = {task: dict(limits) for task in (STEP_TASK, TOOL_TASK, *CONTROL_TASKS)}
    their_annotations = app.conf.task_annotations
    if not their_annotations:
        app.conf.task_annotations = annotations
    else:
        listed = their_annotations if isinstance(their_annotations, (list, tuple)) else [their_annotations]
        app.conf.task_annotations = [annotations, *listed]

    schedule = dict(app.conf.beat_schedule or {})
    schedule.update(ours["beat_schedule"])
    app.conf.beat_schedule = schedule

    registry = AgentRegistry()
    for agent in agents:
        registry.add(agent)
    holder = install_worker(app, settings, registry)
    connect_service_signals(app, settings)
    _schedule_on_the_apps_beat(app)
    return holder


def _schedule_on_the_apps_beat(app: Celery) -> None:
    """When a Beat of ``app`` starts, whatever its scheduler (Celery's own file, a database
    scheduler), add the scheduled batch agents of ``THREADS_AGENTS`` to its schedule.

    At start-up rather than here: the agents' modules often import the project (its models), which
    is not ready while its Celery app is being made. The runtime's own scheduler
    (``-S threads_celery.worker.beat:Scheduler``) adds its own slot-keeping entries instead.
    """

    @beat_init.connect(weak=False)
    def _add_schedules(sender: Any = None, **_: Any) -> None:
        if getattr(sender, "app", None) is not app:
            return
        scheduler = sender.scheduler  # made by now: Beat reads its max_interval before this signal
        if isinstance(scheduler, Scheduler):
            return  # the runtime's own scheduler added its entries, with their slots
        try:
            entries = plain_beat_entries(schedules_for_app(app))
        except Exception:
            log.exception("beat: cannot load the scheduled batch agents; they are not scheduled")
            return
        if entries:
            # Celery's schedulers, and the database ones built on them, take entries this way.
            scheduler.update_from_dict(entries)
            log.info("beat: scheduled batch agents: %s", ", ".join(sorted(entries)))


def _check_guarantees(app: Celery, settings: Settings, broker: str) -> None:
    accepted = app.conf.accept_content
    if accepted is not None and "json" not in accepted and "application/json" not in accepted:
        raise ConfigError(f"accept_content is {list(accepted)!r}: the runtime's tasks are JSON; add 'json' to it")
    if broker.startswith(("redis://", "rediss://")):
        options = app.conf.broker_transport_options or {}
        visibility = options.get("visibility_timeout", 3600)
        limit = settings.task_time_limit_s
        if visibility <= limit:
            raise ConfigError(
                f"broker_transport_options['visibility_timeout'] ({visibility}s) must exceed the runtime's "
                f"task time limit (THREADS_TASK_TIME_LIMIT_S, {limit}s), or Redis delivers a task still "
                "running a second time"
            )


__all__ = ["install"]
