"""The runtime's settings read from Django's (``THREADS_*`` names, as the environment's).

Every setting :class:`~threads_celery.Settings` reads from a ``THREADS_*`` variable may be set in
Django's settings under the same name instead (Django's wins over the environment's):
``THREADS_AGENTS`` as a list of module paths or one comma-separated string, numbers and booleans
as Python values, ``THREADS_RATE_LIMITS`` and ``THREADS_MODEL_PRICES`` as dicts. Two defaults are
Django's own:

- ``THREADS_DATABASE_URL``: the project's ``default`` database when it is PostgreSQL (the ledger
  in tables of its own beside the project's, which is what lets a run be written in a view's
  transaction); any other default database needs the setting.
- ``THREADS_BROKER_URL``: ``CELERY_BROKER_URL`` (the project's Celery app's broker).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

from django.conf import settings as django_settings
from django.db import connections
from sqlalchemy.engine import URL

from threads_celery.exceptions import ConfigError
from threads_celery.settings import Settings

PREFIX = "THREADS_"
#: Settings of this integration's own, read where they are used, never as runtime settings.
DJANGO_ONLY = frozenset({"THREADS_CELERY_APP", "THREADS_MIGRATE_WITH_DJANGO", "THREADS_TENANT_OF_USER"})
POSTGRESQL_ENGINES = ("django.db.backends.postgresql", "django.contrib.gis.db.backends.postgis")


def database_url(alias: str = "default") -> str:
    """The SQLAlchemy URL of Django's database ``alias`` (PostgreSQL, through psycopg 3).

    Read from the connection's settings as they are now, so that under Django's test runner it
    is the test database."""
    try:
        conf = connections[alias].settings_dict
    except KeyError:
        raise ConfigError(f"Django has no database {alias!r} (DATABASES)") from None
    if conf.get("ENGINE") not in POSTGRESQL_ENGINES:
        raise ConfigError(
            f"Django's {alias!r} database is {conf.get('ENGINE')!r}: the ledger lives in PostgreSQL; "
            "set THREADS_DATABASE_URL in your settings"
        )
    port = conf.get("PORT")
    url = URL.create(
        "postgresql+psycopg",
        username=conf.get("USER") or None,
        password=conf.get("PASSWORD") or None,
        host=conf.get("HOST") or None,
        port=int(port) if port else None,
        database=conf.get("NAME") or None,
    )
    return url.render_as_string(hide_password=False)


def _as_variable(name: str, value: Any) -> str:
    """A Django setting's value as the environment variable of the same name would spell it."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float, str)):
        return str(value)
    if isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
        return ",".join(value)
    if isinstance(value, Mapping):
        return json.dumps(value)
    raise ConfigError(f"settings.{name} must be a string, a number, a boolean, a list of strings or a dict")


def threads_variables() -> dict[str, str]:
    """The environment's ``THREADS_*`` variables, overlaid with Django's ``THREADS_*`` settings."""
    variables = {k: v for k, v in os.environ.items() if k.startswith(PREFIX)}
    for name in dir(django_settings):
        if name.startswith(PREFIX) and name not in DJANGO_ONLY:
            value = getattr(django_settings, name)
            if value is not None:
                variables[name] = _as_variable(name, value)
    return variables


def threads_settings() -> Settings:
    """The runtime's :class:`~threads_celery.Settings` from Django's settings (see the module)."""
    variables = threads_variables()
    if not variables.get("THREADS_DATABASE_URL"):
        variables["THREADS_DATABASE_URL"] = database_url()
    if not variables.get("THREADS_BROKER_URL"):
        broker = getattr(django_settings, "CELERY_BROKER_URL", None)
        if not broker:
            raise ConfigError(
                "set THREADS_BROKER_URL or CELERY_BROKER_URL in your settings (e.g. redis://localhost:6379/0)"
            )
        variables["THREADS_BROKER_URL"] = str(broker)
    return Settings.from_env(variables)


__all__ = ["database_url", "threads_settings", "threads_variables"]
