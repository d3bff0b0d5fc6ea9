"""Who calls the HTTP API, and what they own: bearer tokens mapped to a principal and a tenant.

``THREADS_API_TOKENS`` is a comma-separated list. Each entry is either a bare token, as before
(its caller is ``api:<first 8 hex of the token's SHA-256>`` in the ``default`` tenant, so a
one-tenant set-up needs nothing new), or ``principal@tenant=token``::

    THREADS_API_TOKENS = "alice@acme=tok_a1,ci-bot@acme=tok_a2,bob@globex=tok_b1"

Every thread belongs to one tenant: the tenant of the token that started it, and for a child
thread (agent tool, subagent, prompt tool) its parent's. A caller sees, lists, streams, cancels
and decides only what belongs to its tenant; anything else answers exactly as an id that does
not exist (404), and nothing is changed. Approvals, denials and resolutions are recorded under
the token's principal.

Ids a caller chooses (``run_id``, ``thread_id``) belong to its tenant: two tenants may both use
``order-1`` and neither sees nor blocks the other. A chosen id of a tenant other than ``default``
is stored scoped, ``<tenant>~<id>`` (``~`` is in neither a tenant's name nor an id the API
accepts, so no caller can name another tenant's scoped id); the ``default`` tenant keeps the ids
as given, so a one-tenant deployment and ``threads.get_run("order-1")`` see what they always saw.
Server-generated ids (``run_...``, ``thread_...``, child threads and runs) are random and global.
Every id a request names is mapped in here (:func:`owned_thread`, :func:`new_thread`, ...): to
the caller's own stored id when it has one, and otherwise to the id the caller would create, so
another tenant's id (scoped, server-generated or raw) is exactly an unused one. Every id an
answer shows is mapped out (:func:`shown_to`): the caller sees the ids it chose, never the
stored form.

The checks here load a row and compare its tenant; they never write.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from threads_celery.exceptions import CallNotFound, ConfigError, RunNotFound, ThreadNotFound
from threads_celery.records import DEFAULT_TENANT

if TYPE_CHECKING:
    from threads_celery.client.threads import Threads

_NAME = r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}"
_QUALIFIED = re.compile(rf"^(?P<principal>{_NAME})@(?P<tenant>{_NAME})=(?P<token>.*)$")


@dataclass(frozen=True, slots=True)
class Caller:
    """The authenticated caller of a request: who (``principal``) and on whose behalf (``tenant``)."""

    principal: str
    tenant: str = DEFAULT_TENANT


#: How long a principal may be: the ledger records it on decisions (``approved_by``, 255 characters).
MAX_PRINCIPAL_CHARS = 255
_TENANT = re.compile(rf"^{_NAME}$")


def caller_problem(caller: Caller) -> str | None:
    """What makes ``caller`` unusable (a tenant that ids cannot be scoped by, an empty or overlong
    principal), or None. Pure; names the rule, never the value."""
    if not isinstance(caller.tenant, str) or not _TENANT.match(caller.tenant):
        return "its tenant is not 1-128 letters, digits, '_', '.', ':' or '-' (starting with a letter or digit)"
    if not isinstance(caller.principal, str) or not caller.principal.strip():
        return "its principal is empty"
    if len(caller.principal) > MAX_PRINCIPAL_CHARS:
        return f"its principal is over {MAX_PRINCIPAL_CHARS} characters"
    return None


#: The caller of an API whose authentication is switched off (something in front authenticates).
UNAUTHENTICATED = Caller("unauthenticated", DEFAULT_TENANT)


def parse_token_entry(entry: str) -> tuple[str, Caller]:
    """One ``THREADS_API_TOKENS`` entry as (token, caller). Pure.

    ``principal@tenant=token`` names both; a bare token is an anonymous principal of the
    default tenant, named by a digest of the token (never the token itself).
    """
    entry = entry.strip()
    match = _QUALIFIED.match(entry)
    if match is not None:
        token = match["token"].strip()
        if not token:
            raise ConfigError(f"THREADS_API_TOKENS entry for {match['principal']}@{match['tenant']} has an empty token")
        return token, Caller(match["principal"], match["tenant"])
    if not entry:
        raise ConfigError("THREADS_API_TOKENS has an empty entry")
    return entry, Caller(f"api:{hashlib.sha256(entry.encode()).hexdigest()[:8]}", DEFAULT_TENANT)


def callers_from_tokens(entries: Iterable[str] | Mapping[str, Caller]) -> dict[str, Caller]:
    """Token -> caller for every entry; a token given twice with two identities is a ConfigError."""
    if isinstance(entries, Mapping):
        return dict(entries)
    callers: dict[str, Caller] = {}
    for raw in entries:
        if not raw or not raw.strip():
            continue
        token, caller = parse_token_entry(raw)
        if callers.get(token, caller) != caller:
            raise ConfigError("THREADS_API_TOKENS gives one token to two principals")
        callers[token] = caller
    return callers


# -- ids of a tenant ---------------------------------------------------------------------------

#: Between a tenant and its own id in a stored id; never in a tenant's name or an accepted id.
SCOPE_SEPARATOR = "~"


def scoped(tenant: str, given: str) -> str:
    """The stored form of ``given`` in ``tenant``'s own space of ids. Pure."""
    return f"{tenant}{SCOPE_SEPARATOR}{given}"


def shown_to(caller: Caller) -> Callable[[str], str]:
    """What the caller sees of a stored id, or of a runtime-built text naming its stored ids.

    The caller's scope is taken out wherever it occurs: a stored id can hold the caller's
    scoped id inside (an effect key ``acme~order-1:0:0``, an agent-tool run
    ``agent-tool:acme~order-1:0:0``), and an answer only ever holds the caller's own ids.
    """
    prefix = f"{caller.tenant}{SCOPE_SEPARATOR}"
    return lambda value: value.replace(prefix, "")


def _theirs(caller: Caller, given: str, owner: Callable[[str], str | None]) -> str | None:
    """The stored id of the caller's ``given`` (as given, else scoped); None if it has none."""
    for candidate in (given, scoped(caller.tenant, given)):
        if owner(candidate) == caller.tenant:
            return candidate
    return None


def _fresh(caller: Caller, given: str, owner: Callable[[str], str | None]) -> str:
    """The id to store for a ``given`` the caller does not have yet.

    The default tenant keeps the id as given, unless another tenant holds that raw id (a
    random server-generated one, or one stored before ids were scoped): then it is scoped too,
    so that even then the caller cannot tell that the id exists.
    """
    if caller.tenant == DEFAULT_TENANT and owner(given) is None:
        return given
    return scoped(caller.tenant, given)


# -- ownership -------------------------------------------------------------------------------
# Each check asks the runtime which tenant owns the id (``Threads.tenant_of``) and answers a
# missing id and another tenant's id the same way, with the same message (naming the id as the
# caller gave it). Each returns the stored id the routes then work on.


def owned_thread(threads: Threads, caller: Caller, thread_id: str) -> str:
    """The stored id of the caller's thread ``thread_id``; ThreadNotFound if it has none."""
    found = _theirs(caller, thread_id, lambda t: threads.tenant_of(thread_id=t))
    if found is None:
        raise ThreadNotFound(thread_id)
    return found


def owned_run(threads: Threads, caller: Caller, run_id: str) -> str:
    """The stored id of the caller's run ``run_id``; RunNotFound if it has none."""
    found = _theirs(caller, run_id, lambda r: threads.tenant_of(run_id=r))
    if found is None:
        raise RunNotFound(run_id)
    return found


def owned_call(threads: Threads, caller: Caller, effect_key: str) -> str:
    """The stored effect key of the caller's call ``effect_key``; CallNotFound if it has none."""
    found = _theirs(caller, effect_key, lambda k: threads.tenant_of(effect_key=k))
    if found is None:
        raise CallNotFound(effect_key)
    return found


def thread_to_start(threads: Threads, caller: Caller, thread_id: str) -> str:
    """The stored id of ``thread_id`` for a new run: the caller's thread, or the one it would start."""
    owner = lambda t: threads.tenant_of(thread_id=t)  # noqa: E731 - a lookup, used twice
    return _theirs(caller, thread_id, owner) or _fresh(caller, thread_id, owner)


def run_to_start(threads: Threads, caller: Caller, run_id: str) -> str:
    """The stored id of ``run_id`` for a new run: the caller's run (returned as it is), or a new one."""
    owner = lambda r: threads.tenant_of(run_id=r)  # noqa: E731 - a lookup, used twice
    return _theirs(caller, run_id, owner) or _fresh(caller, run_id, owner)
