"""Who may call the HTTP API: bearer tokens from ``THREADS_API_TOKENS``, or none when told so.

Each token maps to a :class:`~threads_celery.api.tenancy.Caller` (principal and tenant). With no
token configured the API refuses to start unless ``THREADS_API_AUTH=off`` says, explicitly, that
something in front of it authenticates.
"""

from __future__ import annotations

import hmac
from collections.abc import Callable, Mapping

from fastapi import Depends, HTTPException, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from threads_celery.api.tenancy import UNAUTHENTICATED, Caller, callers_from_tokens
from threads_celery.exceptions import ConfigError


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


__all__ = [
    "auth_from_env",
    "bearer_auth",
    "callers_from_env",
    "check_auth_config",
    "tokens_from_env",
    "unauthenticated",
]
