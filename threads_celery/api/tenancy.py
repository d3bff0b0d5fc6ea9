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

The checks here load a row and compare its tenant; they never write.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from threads_celery.exceptions import CallNotFound, ConfigError, RunNotFound, ThreadNotFound
from threads_celery.records import DEFAULT_TENANT

if TYPE_CHECKING:
    from threads_celery.client.threads import Threads
    from threads_celery.transitions.pending import PendingCall

_NAME = r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}"
_QUALIFIED = re.compile(rf"^(?P<principal>{_NAME})@(?P<tenant>{_NAME})=(?P<token>.*)$")


@dataclass(frozen=True, slots=True)
class Caller:
    """The authenticated caller of a request: who (``principal``) and on whose behalf (``tenant``)."""

    principal: str
    tenant: str = DEFAULT_TENANT


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


# -- ownership -------------------------------------------------------------------------------
# Each check asks the runtime which tenant owns the id (``Threads.tenant_of``) and answers a
# missing id and another tenant's id the same way, with the same message.


def owned_thread(threads: Threads, caller: Caller, thread_id: str) -> None:
    """Nothing, if the thread exists and is the caller's; else ThreadNotFound."""
    if threads.tenant_of(thread_id=thread_id) != caller.tenant:
        raise ThreadNotFound(thread_id)


def owned_run(threads: Threads, caller: Caller, run_id: str) -> None:
    """Nothing, if the run exists and its thread is the caller's; else RunNotFound."""
    if threads.tenant_of(run_id=run_id) != caller.tenant:
        raise RunNotFound(run_id)


def owned_call(threads: Threads, caller: Caller, effect_key: str) -> None:
    """Nothing, if the call exists and its thread is the caller's; else CallNotFound."""
    if threads.tenant_of(effect_key=effect_key) != caller.tenant:
        raise CallNotFound(effect_key)


def only_theirs(threads: Threads, caller: Caller, calls: list[PendingCall]) -> list[PendingCall]:
    """The calls whose thread belongs to the caller's tenant."""
    tenants: dict[str, str | None] = {}
    for call in calls:
        if call.thread_id not in tenants:
            tenants[call.thread_id] = threads.tenant_of(thread_id=call.thread_id)
    return [c for c in calls if tenants[c.thread_id] == caller.tenant]
