"""``manage.py threads worker|beat|migrate``: the project's worker and Beat, and the ledger's migrations.

``worker`` and ``beat`` run Celery's own commands on the project's Celery app (``THREADS_CELERY_APP``,
by default ``app`` of the ``celery`` module beside the settings module, as ``proj/celery.py``),
the runtime installed on it; every option after the service's name is Celery's
(``manage.py threads worker -Q threads,proj --concurrency 4``). A project without a Celery app
of its own runs the runtime's. ``migrate`` applies the ledger's migrations.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
from typing import Any

from celery import Celery
from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from threads_celery.exceptions import ThreadsError

SERVICES = ("worker", "beat", "migrate")


def project_celery_app() -> Celery:
    """The project's Celery app with the runtime on it (installed here if its module did not),
    or the runtime's own app when the project has none."""
    from threads_celery.contrib.django.runtime import install

    spec = getattr(settings, "THREADS_CELERY_APP", None)
    if spec is None:
        package = str(getattr(settings, "SETTINGS_MODULE", None) or "").rpartition(".")[0]
        if not package or importlib.util.find_spec(f"{package}.celery") is None:
            return _runtime_app()
        spec = f"{package}.celery:app"
    module_name, _, attr = str(spec).partition(":")
    try:
        app = getattr(importlib.import_module(module_name), attr or "app", None)
    except ModuleNotFoundError as exc:
        raise CommandError(f"THREADS_CELERY_APP={spec!r}: no module {exc.name!r}") from exc
    if not isinstance(app, Celery):
        raise CommandError(f"THREADS_CELERY_APP={spec!r} is not a Celery app (write 'module:attribute')")
    install(app)
    return app


def _runtime_app() -> Celery:
    """The runtime's own Celery app, configured from Django's settings."""
    from threads_celery.contrib.django.configuration import threads_settings, threads_variables
    from threads_celery.worker.application import app_from_environment

    settings_now = threads_settings()  # the defaults Django's settings give, checked
    os.environ.update(threads_variables())
    os.environ["THREADS_DATABASE_URL"] = str(settings_now.database_url)
    os.environ["THREADS_BROKER_URL"] = str(settings_now.broker_url)
    return app_from_environment()


class Command(BaseCommand):
    help = "threads-celery: run the worker or Beat on the project's Celery app, or migrate the ledger."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("service", choices=SERVICES, help="worker, beat or migrate")
        parser.add_argument("celery_options", nargs=argparse.REMAINDER, help="options for Celery's own command")

    def handle(self, *args: Any, service: str, celery_options: list[str], **options: Any) -> None:
        try:
            if service == "migrate":
                if celery_options:
                    raise CommandError(f"threads migrate takes no options: {' '.join(celery_options)}")
                from threads_celery.contrib.django.migrations_of_ledger import upgrade_ledger

                self.stdout.write(f"threads-celery ledger: {upgrade_ledger()}")
                return
            app = project_celery_app()
            code: int | None = app.start([service, *celery_options])
        except ThreadsError as exc:
            raise CommandError(f"{service} cannot start: {exc}") from exc
        if code:
            raise SystemExit(code)
