"""Flower behind basic authentication, ``/metrics`` included, and never with empty credentials.

Flower 2 checks ``--basic-auth`` on its pages and API but serves ``/metrics`` (task names, worker
names, queue lengths) to anyone, and started with ``--basic-auth=:`` it lets in whoever sends an
empty user and password. ``threads-celery flower`` is the launcher we ship and document: it reads
``FLOWER_USER`` and ``FLOWER_PASSWORD``, refuses to start when either is empty, and puts
``/metrics`` behind the same check as every other page before Flower starts.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, NamedTuple

from threads_celery.exceptions import ConfigError

if TYPE_CHECKING:
    from celery import Celery

#: Flower options read from the environment that would open its API to anonymous callers.
_OPENING_VARIABLES = ("FLOWER_UNAUTHENTICATED_API", "FLOWER_BASIC_AUTH", "FLOWER_AUTH")


class FlowerCredentials(NamedTuple):
    """The one user and password Flower's basic authentication accepts."""

    user: str
    password: str

    def basic_auth_option(self) -> str:
        """The ``--basic-auth`` value Flower expects (``user:password``)."""
        return f"{self.user}:{self.password}"


def flower_credentials(environ: Mapping[str, str]) -> FlowerCredentials:
    """``FLOWER_USER`` and ``FLOWER_PASSWORD`` from ``environ``, or a ``ConfigError`` saying why not.

    Empty values are refused (Flower would accept an empty login), and so are a ``:`` in the user
    and a ``,`` in either (Flower splits its option on ``,`` and the pair on ``:``, so either would
    silently admit a different credential than the one configured).
    """
    user = environ.get("FLOWER_USER", "")
    password = environ.get("FLOWER_PASSWORD", "")
    if not user.strip() or not password.strip():
        raise ConfigError(
            "refusing to start Flower without credentials: set FLOWER_USER and FLOWER_PASSWORD "
            "to non-empty values (Flower would let anyone in with an empty login)"
        )
    if ":" in user:
        raise ConfigError("FLOWER_USER must not contain ':' (Flower splits user and password on it)")
    if "," in user or "," in password:
        raise ConfigError(
            "FLOWER_USER and FLOWER_PASSWORD must not contain ',' (Flower splits its --basic-auth option on it)"
        )
    for name in _OPENING_VARIABLES:
        if environ.get(name):
            raise ConfigError(f"unset {name}: `threads-celery flower` configures Flower's authentication itself")
    return FlowerCredentials(user, password)


def require_auth_on_metrics() -> None:
    """Route ``/metrics`` to a handler that asks for the same credentials as Flower's pages.

    Flower's application reads its route table (``flower.urls.handlers``) when it is built, so
    replacing the entry in that list before Flower starts is enough. Idempotent.
    """
    # Flower (and tornado, which it brings) is the optional flower extra: imported when the gate
    # is installed by `threads-celery flower`, never by a worker.
    try:
        import tornado.web
        from flower import urls
        from flower.views.monitor import Metrics
    except ImportError as exc:
        raise ConfigError(f"Flower is not installed here ({exc}): pip install 'threads-celery[flower]'") from None

    # Flower ships no type information, so Metrics is Any to mypy: subclassing it is allowed here.
    class AuthenticatedMetrics(Metrics):  # type: ignore[misc]
        """Flower's Prometheus endpoint, behind Flower's authentication."""

        @tornado.web.authenticated
        async def get(self) -> None:
            await super().get()

    for index, route in enumerate(urls.handlers):
        if isinstance(route, tuple) and route[0] == r"/metrics":
            urls.handlers[index] = (route[0], AuthenticatedMetrics, *route[2:])


def flower_argv(credentials: FlowerCredentials, *, address: str, port: int, extra: tuple[str, ...] = ()) -> list[str]:
    """The arguments of Celery's ``flower`` sub-command for these credentials and this address."""
    return [
        "flower",
        f"--address={address}",
        f"--port={port}",
        *extra,
        f"--basic-auth={credentials.basic_auth_option()}",
    ]


def start_flower(celery_app: Celery, environ: Mapping[str, str], *, address: str, port: int) -> None:
    """Start Flower on ``celery_app`` behind basic authentication; refuse empty credentials.

    The credentials travel in-process (``celery_app.start(argv)``), so they never show in the
    process list.
    """
    credentials = flower_credentials(environ)
    require_auth_on_metrics()
    celery_app.start(flower_argv(credentials, address=address, port=port))
