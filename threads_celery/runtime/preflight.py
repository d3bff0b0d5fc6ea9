"""Start-up checks: a worker, Beat or the API refuses to start, in one line, when it cannot work.

Each check raises a :class:`~threads_celery.exceptions.ThreadsError` whose message is that line:
the secret key is malformed, the database is unset or unreachable, its migrations are not at head, an agent module does not
import, or an agent's model provider package or API key is missing. The services call
:func:`preflight` before they accept work, and :func:`exit_on_failure` turns a failure into one
red line on stderr and exit status 2 (never a traceback, never a worker that says "ready" and then
fails every task).
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, NoReturn

from sqlalchemy.exc import SQLAlchemyError

from threads_celery.definitions.model_strings import our_extra, resolve_model
from threads_celery.definitions.variables import check_secret_key as check_secret_key_in
from threads_celery.exceptions import ConfigError, ModelUnavailable, StoreUnavailable, ThreadsError
from threads_celery.store.availability import is_refused_for_good, store_unavailable
from threads_celery.store.engine import safe_url
from threads_celery.store.migrate import current_revision, head_revision

if TYPE_CHECKING:
    from threads_celery.definitions.agents import Agent
    from threads_celery.store import Store

#: Exit status of a service that refused to start (as the CLI's usage/configuration errors).
EXIT_REFUSED = 2


@dataclass(frozen=True, slots=True)
class Ready:
    """What a successful preflight found: the database revision and the agents loaded."""

    revision: str
    agents: tuple[str, ...]


def check_secret_key() -> None:
    """A ConfigError when ``THREADS_SECRET_KEY`` is set but malformed (never its value)."""
    check_secret_key_in(os.environ)


def require_database_url(database_url: str | None, *, service: str) -> str:
    """The URL, or a ConfigError saying that ``service`` needs one."""
    if not database_url:
        raise ConfigError(
            f"THREADS_DATABASE_URL is not set: the {service} needs the PostgreSQL ledger "
            "(e.g. postgresql://app@localhost/threads)"
        )
    return database_url


def check_database(store: Store) -> str:
    """The database's revision, once it answers and is at head; StoreUnavailable or ConfigError."""
    where = safe_url(store.engine.url)
    try:
        current = current_revision(store.engine)
    except SQLAlchemyError as exc:
        raise store_unavailable(store.engine.url, exc) from exc
    head = head_revision()
    if current != head:
        raise ConfigError(
            f"the database at {where} is at migration {current or 'none'}, not {head}: run `threads-celery db upgrade`"
        )
    return head


def wait_for_database(
    store: Store,
    *,
    wait_s: float,
    service: str,
    say: Callable[[str], None] | None = None,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> str:
    """:func:`check_database`, tried again for up to ``wait_s`` seconds while the database does not answer.

    A restart or a failover of PostgreSQL (or of PgBouncer) takes seconds; a worker or Beat
    started in them waits, as Celery waits for its broker, and says so once per attempt. What no
    wait fixes is refused at once: a database or role that does not exist, a wrong password,
    migrations not at head. After ``wait_s`` the last StoreUnavailable is raised, its message
    saying how long it waited.
    """
    say = say or _to_stderr
    deadline = clock() + wait_s
    pause = 0.5
    while True:
        try:
            return check_database(store)
        except StoreUnavailable as exc:
            left = deadline - clock()
            if is_refused_for_good(exc) or left <= 0:
                if wait_s > 0 and not is_refused_for_good(exc):
                    raise StoreUnavailable(f"{one_line(exc)} (waited {wait_s:g}s)") from exc
                raise
            say(f"{service}: {one_line(exc)}; trying again in {min(pause, left):.1f}s (for {left:.0f}s more)")
            sleep(min(pause, left))
            pause = min(pause * 2, 5.0)


def _to_stderr(line: str) -> None:
    stream = sys.__stderr__ or sys.stderr
    stream.write(f"warning: {line}\n")
    stream.flush()


def model_problem(model: object) -> str | None:
    """Why a model string cannot be used here (provider package or API key missing), or None.

    Model objects were built by the user's code, so their package is importable; only strings are
    resolved, as a worker would on its first step.
    """
    # An adapted Pydantic AI agent's model string is resolved lazily: check the string it wraps.
    model = getattr(model, "unresolved_spec", None) or model
    if not isinstance(model, str):
        return None
    try:
        resolve_model(model)
    except ImportError as exc:
        return our_extra(_first_line(exc)) or "its provider package is not installed"
    except ModelUnavailable as exc:  # no API key, an unknown provider: pydantic-ai's own line
        return exc.message.partition(" cannot be used here: ")[2] or exc.message
    except Exception as exc:  # noqa: BLE001 - pydantic-ai raises UserError for a missing key or unknown provider
        return _first_line(exc) or type(exc).__name__
    return None


def check_models(agents: Iterable[Agent]) -> None:
    """A ConfigError naming the first agent whose model cannot be built in this process."""
    for agent in agents:
        problem = model_problem(agent.model)
        if problem is not None:
            raise ConfigError(f"agent {agent.name!r}: model {agent.model!r} cannot be used: {problem}")


def _first_line(exc: BaseException) -> str:
    lines = [line.strip() for line in str(exc).strip().splitlines() if line.strip()]
    return lines[0] if lines else ""


def one_line(exc: BaseException) -> str:
    """The message of a start-up failure as one line (agent import errors can span several)."""
    message = exc.message if isinstance(exc, ThreadsError) else f"{type(exc).__name__}: {exc}"
    return " ".join(part.strip() for part in (message or type(exc).__name__).splitlines() if part.strip())


def refuse(exc: BaseException, *, service: str) -> NoReturn:
    """Print the failure as one line on stderr and exit with :data:`EXIT_REFUSED`."""
    # The real stderr: Celery may have redirected sys.stderr to its logger by now.
    stream = sys.__stderr__ or sys.stderr
    stream.write(f"error: {service} cannot start: {one_line(exc)}\n")
    stream.flush()
    raise SystemExit(EXIT_REFUSED)


@contextmanager
def exit_on_failure(service: str) -> Iterator[None]:
    """Turn a ThreadsError raised inside the block into :func:`refuse`."""
    try:
        yield
    except ThreadsError as exc:
        refuse(exc, service=service)


def guarded(service: str, check: Callable[[], object]) -> None:
    """Run ``check``; on a ThreadsError, refuse to start ``service``."""
    with exit_on_failure(service):
        check()
