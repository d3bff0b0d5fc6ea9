"""threads_celery.contrib.django without services: importable without loading Django, and the
runtime's settings read from Django's (each case in a fresh interpreter, so that configuring
Django here changes no other test)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from tests.integration.django_project.harness import require_django
from tests.support.processes import subprocess_env

require_django()


def run(script: str) -> str:
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script)],
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


CONFIGURE = """
import django
from django.conf import settings
settings.configure(
    DATABASES={"default": {"ENGINE": "django.db.backends.%s", "NAME": "shop", "HOST": "db.internal",
                           "PORT": "5433", "USER": "shop", "PASSWORD": "s3cret"}},
    INSTALLED_APPS=["threads_celery.contrib.django"],
    CELERY_BROKER_URL="redis://cache:6379/2",
    %s
)
django.setup()
from threads_celery.contrib.django import threads_settings
"""


def test_importing_the_package_loads_neither_django_nor_the_runtime() -> None:
    out = run("""
        import sys
        import threads_celery.contrib.django as dj
        print(sorted(m for m in sys.modules if m == "django" or m.startswith(("django.", "threads_celery.client"))))
        print(callable(dj.get_threads) and "django" in sys.modules)
    """)
    assert out.splitlines() == ["[]", "True"]  # and the names load Django when first used


def test_the_ledger_defaults_to_the_default_database_and_the_broker_to_celerys() -> None:
    out = run(CONFIGURE % ("postgresql", "") + "s = threads_settings(); print(s.database_url); print(s.broker_url)")
    assert out.splitlines() == ["postgresql+psycopg://shop:s3cret@db.internal:5433/shop", "redis://cache:6379/2"]


def test_threads_settings_are_read_with_their_python_types() -> None:
    extra = (
        'THREADS_DATABASE_URL="postgresql://ledger@db/threads", THREADS_AGENTS=["shop.agents", "billing.agents"], '
        "THREADS_TASK_EVENTS=True, THREADS_STEP_LEASE_S=30, THREADS_RATE_LIMITS={'openai': {'requests_per_minute': 60}},"
        # The integration's own settings are not the runtime's: a function is fine there.
        "THREADS_TENANT_OF_USER=lambda user: 'acme', THREADS_MIGRATE_WITH_DJANGO=False,"
    )
    out = run(
        CONFIGURE % ("postgresql", extra)
        + "s = threads_settings(); print(s.database_url, s.agents, s.task_events, s.step_lease_s, sorted(s.rate_limits))"
    )
    assert out == "postgresql://ledger@db/threads ('shop.agents', 'billing.agents') True 30.0 ['openai']"


def test_a_default_database_that_is_not_postgresql_needs_the_setting() -> None:
    out = run(
        CONFIGURE % ("sqlite3", "")
        + textwrap.dedent("""
        from threads_celery.exceptions import ConfigError
        try:
            threads_settings()
        except ConfigError as exc:
            print(exc)
        """)
    )
    assert "is 'django.db.backends.sqlite3': the ledger lives in PostgreSQL; set THREADS_DATABASE_URL" in out


def test_a_setting_of_a_type_no_variable_can_spell_is_refused_naming_it() -> None:
    out = run(
        CONFIGURE % ("postgresql", "THREADS_AGENTS=[1, 2],")
        + textwrap.dedent("""
        from threads_celery.exceptions import ConfigError
        try:
            threads_settings()
        except ConfigError as exc:
            print(exc)
        """)
    )
    assert out == "settings.THREADS_AGENTS must be a string, a number, a boolean, a list of strings or a dict"


def test_a_users_tenant_is_its_primary_key_or_what_the_setting_names() -> None:
    script = CONFIGURE % ("postgresql", 'THREADS_TENANT_OF_USER="nowhere.tenant_of",') + textwrap.dedent("""
        from types import SimpleNamespace
        from django.conf import settings
        from fastapi import HTTPException
        from threads_celery.contrib.django.asgi import caller_of, tenant_function
        from threads_celery.exceptions import ConfigError
        try:
            tenant_function()
        except ConfigError as exc:
            print(str(exc).split(":")[0])
        user = SimpleNamespace(pk=7, get_username=lambda: "ann", company="acme")
        del settings.THREADS_TENANT_OF_USER
        print(caller_of(user))
        settings.THREADS_TENANT_OF_USER = lambda u: u.company
        print(caller_of(user))
        settings.THREADS_TENANT_OF_USER = lambda u: 7
        try:
            caller_of(user)
        except HTTPException as exc:
            print(exc.status_code)
    """)
    assert run(script).splitlines() == [
        "settings.THREADS_TENANT_OF_USER = 'nowhere.tenant_of' names nothing importable",
        "Caller(principal='ann', tenant='7')",
        "Caller(principal='ann', tenant='acme')",
        "401",
    ]
