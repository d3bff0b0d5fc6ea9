"""The Django app (``INSTALLED_APPS = [..., "threads_celery.contrib.django"]``).

Its only work at start-up is to have ``manage.py migrate`` bring the ledger's tables up to date
too (they are the runtime's, migrated with its own migrations, not Django models), so that a
fresh database, Django's test databases included, has them. ``THREADS_MIGRATE_WITH_DJANGO =
False`` leaves that to ``manage.py threads migrate``.
"""

from __future__ import annotations

from typing import Any

from django.apps import AppConfig
from django.conf import settings
from django.db.models.signals import post_migrate


class ThreadsConfig(AppConfig):
    """threads-celery's app: its settings, its ``manage.py threads`` command, its migrations."""

    name = "threads_celery.contrib.django"
    label = "threads_celery"
    verbose_name = "threads-celery"

    def ready(self) -> None:
        if getattr(settings, "THREADS_MIGRATE_WITH_DJANGO", True):
            post_migrate.connect(migrate_ledger, sender=self, dispatch_uid="threads_celery.migrate_ledger")


def migrate_ledger(*, using: str = "default", verbosity: int = 1, **_: Any) -> None:
    """After Django's ``migrate`` of its default database: the ledger's migrations too."""
    if using != "default":
        return
    from threads_celery.contrib.django.migrations_of_ledger import upgrade_ledger

    done = upgrade_ledger()
    if verbosity >= 1:
        print(f"  threads-celery ledger: {done}")


__all__ = ["ThreadsConfig", "migrate_ledger"]
