"""The HTTP API and the console in the project's ASGI application, behind Django's own sign-in.

``proj/asgi.py``::

    application = with_threads(get_asgi_application())

serves the API at ``/agents/api`` (``/agents/api/v1/runs``...) and the console at
``/agents/console``, and everything else with Django. A request's caller is the Django user of
its session cookie, read with Django's own session engine and ``get_user`` (so a signed-out,
inactive or password-changed user is no caller): no user is a 401; on the console, a user who
is not staff is a 403. The user's tenant is ``THREADS_TENANT_OF_USER`` (the dotted path of a
function of the user answering a string; by default the user's primary key), so a user sees and
starts its tenant's runs only; the principal recorded for its decisions is its username.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from asgiref.sync import sync_to_async
from django.conf import settings
from django.contrib.auth import get_user
from django.db import close_old_connections
from django.http import HttpRequest
from django.utils.module_loading import import_string
from fastapi import HTTPException, Request
from starlette.applications import Starlette
from starlette.routing import Mount
from starlette.types import ASGIApp

from threads_celery.api.tenancy import Caller
from threads_celery.exceptions import ConfigError

if TYPE_CHECKING:
    from threads_celery.client.threads import Threads

TENANT_SETTING = "THREADS_TENANT_OF_USER"
NOT_SIGNED_IN = HTTPException(401, "sign in to the site first", headers={"WWW-Authenticate": "Session"})
log = logging.getLogger("threads_celery.contrib.django")


def default_tenant_of(user: Any) -> str:
    """A user's tenant by default: its primary key."""
    return str(user.pk)


def tenant_function() -> Callable[[Any], str]:
    """The function ``THREADS_TENANT_OF_USER`` names (the default when unset)."""
    path = getattr(settings, TENANT_SETTING, None)
    if path is None:
        return default_tenant_of
    if callable(path):
        return path  # type: ignore[no-any-return]  # a function given as is, not as its path
    try:
        found = import_string(str(path))
    except ImportError as exc:
        raise ConfigError(f"settings.{TENANT_SETTING} = {path!r} names nothing importable: {exc}") from None
    if not callable(found):
        raise ConfigError(f"settings.{TENANT_SETTING} = {path!r} is not a function of the user")
    return found  # type: ignore[no-any-return]  # checked callable; Django's import_string is untyped


def _session_user(session_key: str) -> Any:
    """The signed-in, active user of a session, or None (in a thread: Django's ORM is sync)."""
    close_old_connections()
    try:
        engine = import_string(f"{settings.SESSION_ENGINE}.SessionStore")
        request = HttpRequest()
        request.session = engine(session_key)
        user = get_user(request)
        return user if user.is_authenticated else None
    finally:
        close_old_connections()


async def signed_in_user(request: Request) -> Any:
    """The Django user of the request's session cookie, or None."""
    session_key = request.cookies.get(settings.SESSION_COOKIE_NAME)
    if not session_key:
        return None
    return await sync_to_async(_session_user)(session_key)


def caller_of(user: Any) -> Caller:
    """The API's caller for a Django user: its username, and its tenant (``THREADS_TENANT_OF_USER``).

    A tenant function answering anything but a non-empty string is logged as an error naming
    the setting and the type (never the value), and the request is a 401, never a 500."""
    tenant = tenant_function()(user)
    if not isinstance(tenant, str) or not tenant:
        log.error("settings.%s answered %s for a user, not a tenant name", TENANT_SETTING, type(tenant).__name__)
        raise NOT_SIGNED_IN
    return Caller(principal=user.get_username(), tenant=tenant)


async def user_caller(request: Request) -> Caller:
    """The API's dependency: any signed-in user, as its tenant's caller."""
    user = await signed_in_user(request)
    if user is None:
        raise NOT_SIGNED_IN
    return caller_of(user)


async def staff_caller(request: Request) -> Caller:
    """The console's dependency: signed-in staff users only."""
    user = await signed_in_user(request)
    if user is None:
        raise NOT_SIGNED_IN
    if not user.is_staff:
        raise HTTPException(403, "the console is for staff users")
    return caller_of(user)


def with_threads(
    django_app: ASGIApp,
    *,
    threads: Threads | None = None,
    api_path: str = "/agents/api",
    console_path: str | None = "/agents/console",
) -> Starlette:
    """Django's ASGI application with the API at ``api_path`` and the console at
    ``console_path`` (None: no console), both behind Django's sign-in (see the module)."""
    from threads_celery.api import create_api, create_console
    from threads_celery.contrib.django.runtime import get_threads

    tenant_function()  # a setting naming nothing is refused now, not at the first request
    runtime = threads if threads is not None else get_threads()
    routes = [Mount(api_path, app=create_api(runtime, caller=user_caller, console=False))]
    if console_path is not None:
        routes.append(Mount(console_path, app=create_console(runtime, caller=staff_caller)))
    routes.append(Mount("", app=django_app))
    return Starlette(routes=routes)


__all__ = ["caller_of", "default_tenant_of", "signed_in_user", "staff_caller", "user_caller", "with_threads"]
