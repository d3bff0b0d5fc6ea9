"""Who may call the HTTP API: bearer tokens from ``THREADS_API_TOKENS``, the app's own FastAPI
dependency (``caller=``), or none when told so.

Each token maps to a :class:`~threads_celery.api.tenancy.Caller` (principal and tenant). With no
token configured the API refuses to start unless ``THREADS_API_AUTH=off`` says, explicitly, that
something in front of it authenticates.

An app with authentication of its own (sessions, OAuth, JWT, an API key) passes a dependency
instead (:func:`caller_dependency`): it answers the request's :class:`Caller` or raises
``HTTPException`` (401, 403), and the tokens are not used at all. A dependency whose declared
return type is not a Caller is refused when the app is built (TypeError); one that answers
something else at run time is a logged error and a 401 for that request: a request is never
served as nobody in particular, and the answer says nothing of what was returned.
"""

from __future__ import annotations

import hmac
import inspect
import logging
import types
import typing
from collections.abc import Callable, Mapping
from typing import Any

from fastapi import Depends, HTTPException, Request
from fastapi.params import Depends as DependsMarker
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from threads_celery.api.tenancy import UNAUTHENTICATED, Caller, caller_problem, callers_from_tokens
from threads_celery.exceptions import ConfigError

log = logging.getLogger("threads_celery.api.auth")


def callers_from_env(env: Mapping[str, str]) -> dict[str, Caller]:
    """Token -> caller as ``THREADS_API_TOKENS`` defines them (see :mod:`threads_celery.api.tenancy`)."""
    return callers_from_tokens(env.get("THREADS_API_TOKENS", "").split(","))


def tokens_from_env(env: Mapping[str, str]) -> set[str]:
    """The bearer tokens ``THREADS_API_TOKENS`` defines."""
    return set(callers_from_env(env))


def auth_from_env(env: Mapping[str, str]) -> bool:
    raw = env.get("THREADS_API_AUTH", "").strip().lower()
    if raw in ("", "on", "true", "1", "bearer"):
        return True
    if raw in ("off", "false", "0"):
        return False
    raise ConfigError(f"THREADS_API_AUTH must be 'on' or 'off', not {raw!r}")


def check_auth_config(auth: bool, tokens: set[str]) -> None:
    """ConfigError for authentication switched on with no token to check against."""
    if auth and not tokens:
        raise ConfigError(
            "the HTTP API needs bearer tokens: set THREADS_API_TOKENS=token1,token2 "
            "(or THREADS_API_AUTH=off when something in front of it authenticates)"
        )


def unauthenticated(request: Request) -> Caller:
    """The caller of every request when authentication is off."""
    request.state.caller = UNAUTHENTICATED
    return UNAUTHENTICATED


def bearer_auth(callers: Mapping[str, Caller]) -> Callable[..., Caller]:
    """A FastAPI dependency answering the caller of a request's bearer token, or 401."""
    scheme = HTTPBearer(auto_error=False, description="A token from THREADS_API_TOKENS.")
    known = [(t.encode(), caller) for t, caller in callers.items()]

    # A default, not Annotated[...]: with postponed annotations FastAPI resolves names in the
    # module's globals, where this closure's ``scheme`` is not.
    def require_token(request: Request, credentials: HTTPAuthorizationCredentials | None = Depends(scheme)) -> Caller:
        if credentials is None:
            raise HTTPException(
                401, "missing bearer token (send Authorization: Bearer <token>)",
                headers={"WWW-Authenticate": 'Bearer realm="threads-celery"'},
            )  # fmt: skip
        given = credentials.credentials.encode()
        # Compare against every token, always, so timing says nothing about which one is close.
        matched: Caller | None = None
        for token, caller in known:
            if hmac.compare_digest(given, token):
                matched = caller
        if matched is None:
            raise HTTPException(
                401, "invalid bearer token",
                headers={"WWW-Authenticate": 'Bearer realm="threads-celery", error="invalid_token"'},
            )  # fmt: skip
        # For the error answers: they name ids in the caller's own form (tenancy.shown_to).
        request.state.caller = matched
        return matched

    return require_token


# -- the app's own dependency ------------------------------------------------------------------


def _name_of(dependency: object) -> str:
    """The dependency as a log line names it: its module and qualified name."""
    owner = getattr(dependency, "__module__", None) or "?"
    return f"{owner}.{getattr(dependency, '__qualname__', type(dependency).__qualname__)}"


def _declared_return(dependency: Callable[..., Any]) -> object:
    """The return type the dependency declares (a class's instances for a class), or None when it
    declares none that can be read (no annotation, a name that does not resolve, a generator)."""
    if isinstance(dependency, type):
        return dependency
    if inspect.isgeneratorfunction(dependency) or inspect.isasyncgenfunction(dependency):
        return None  # yields its caller: Iterator[Caller] says nothing more useful here
    target = dependency if inspect.isroutine(dependency) else type(dependency).__call__
    try:
        hints = typing.get_type_hints(target)
    except Exception:  # noqa: BLE001 - an annotation that does not resolve is no verdict
        return None
    return hints.get("return")


def _answers_callers(declared: object) -> bool:
    """Whether a declared return type is a Caller (or a Caller or None); Any and generics pass."""
    if declared is None or declared is Any:
        return True
    if isinstance(declared, type):
        return issubclass(declared, Caller) or declared is type(None)
    origin = typing.get_origin(declared)
    if origin in (typing.Union, types.UnionType):
        return all(_answers_callers(member) for member in typing.get_args(declared))
    # dict[str, str], list[User] are never a Caller; a form this check does not read (a TypeVar,
    # Annotated[...]) passes, and the request decides.
    return not isinstance(origin, type)


def caller_dependency(dependency: object, *, argument: str = "caller") -> Callable[..., Any]:
    """The API's caller dependency from the app's own: it runs ``dependency`` (with everything it
    declares: ``Request``, headers, cookies, other ``Depends``) and answers its Caller.

    ``dependency`` is a sync or async callable (or ``Depends(callable)``) returning a
    :class:`Caller` or raising ``HTTPException``. TypeError now if it is not callable or declares
    a return type that is not a Caller. At run time, ``None`` is a 401 ("not authenticated"), and
    anything else that is not a Caller, or a Caller whose tenant cannot own ids (1-128 letters,
    digits, ``_.:-``) or whose principal is empty or over 255 characters, is logged as an error
    naming the dependency and what is wrong, and answered 401 too (never a 500, never the value).
    """
    if isinstance(dependency, DependsMarker):
        dependency = dependency.dependency
    if dependency is None or not callable(dependency):
        raise TypeError(
            f"{argument}= takes a FastAPI dependency (a function answering a Caller), not {type(dependency).__name__}"
        )
    declared = _declared_return(dependency)
    name = _name_of(dependency)
    if not _answers_callers(declared):
        raise TypeError(
            f"{argument}=: the dependency {name} returns {getattr(typing.get_origin(declared) or declared, '__name__', declared)}, "
            "not a Caller(principal, tenant): map your user to one"
        )

    async def caller_of(request: Request, found: Any = Depends(dependency)) -> Caller:
        problem = caller_problem(found) if isinstance(found, Caller) else None
        if isinstance(found, Caller) and problem is None:
            # For the error answers: they name ids in the caller's own form (tenancy.shown_to).
            request.state.caller = found
            return found
        if problem is not None:
            log.error("the caller dependency %s answered a Caller that %s: the request is refused (401)", name, problem)
        elif found is not None:
            log.error(
                "the caller dependency %s answered a %s, not a Caller: the request is refused (401)",
                name,
                type(found).__name__,
            )
        raise HTTPException(401, "not authenticated")

    caller_of.__qualname__ = f"caller_of[{name}]"
    return caller_of


__all__ = [
    "auth_from_env",
    "bearer_auth",
    "caller_dependency",
    "callers_from_env",
    "check_auth_config",
    "tokens_from_env",
    "unauthenticated",
]
