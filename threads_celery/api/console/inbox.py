"""The console's inbox: every call of the tenant that waits for a person, and the answers to it.

Calls awaiting approval are approved (for their arguments, or for edited ones, validated against
the tool's schema and bound to the approval exactly as ``POST /v1/calls/{key}/approve`` does) or
denied; parked calls are resolved ``assume_done`` or ``assume_not_done``; a variable a run waits
for is set on the call's thread (a secret's field is a password field, never filled in). The
remembered decisions ("always allow") are listed, each revocable. Every answer is recorded under
the principal of the token the person signed in with.

A run's page answers its waiting calls with the same forms. Every form goes back (303) to the page
it came from (its ``back`` field: ``inbox``, or ``run:<run id>``); a refused one goes back there
too, with a notice that says why and keeps what was typed (:mod:`~threads_celery.api.console.notices`),
so a reload never sends the form again.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable
from typing import Annotated, Any
from urllib.parse import quote

from fastapi import FastAPI, Path, Query, Request, Response
from fastapi.responses import HTMLResponse, RedirectResponse
from pydantic import ValidationError
from starlette.concurrency import run_in_threadpool

from threads_celery.api.bodies import EFFECT_KEY_PATTERN, ID_PATTERN, Approve, Deny, Resolve
from threads_celery.api.console.notices import Notice, draft_of
from threads_celery.api.console.pages import Console, base_of
from threads_celery.api.console.session import Session
from threads_celery.api.tenancy import owned_call, owned_thread
from threads_celery.definitions.variables import VariableError
from threads_celery.exceptions import CallStateError, ConfigError, InvalidArguments
from threads_celery.store import Tx
from threads_celery.transitions.pending import WAITING, PendingCall

log = logging.getLogger("threads_celery.api.console")

EffectKey = Annotated[str, Path(pattern=EFFECT_KEY_PATTERN)]
ThreadId = Annotated[str, Path(pattern=ID_PATTERN)]
#: The token of a refused answer's notice (see notices.Notices.put).
NoticeToken = Annotated[str | None, Query(max_length=64, pattern=r"^[A-Za-z0-9_\-]+$")]
#: A form's ``back`` field naming a run's page: ``run:<run id>``.
RUN_BACK = "run:"
_REFUSALS = (CallStateError, ConfigError, InvalidArguments, VariableError, ValidationError, ValueError)


def _pretty(args: str) -> str:
    """Arguments as an editable, indented JSON text (as stored when they are not JSON)."""
    try:
        return json.dumps(json.loads(args), indent=2, ensure_ascii=False)
    except ValueError:
        return args


def _message(exc: Exception) -> str:
    if isinstance(exc, ValidationError):
        return "; ".join(f"{'.'.join(str(p) for p in e['loc']) or 'body'}: {e['msg']}" for e in exc.errors())
    return str(exc)


def add_routes(app: FastAPI, console: Console) -> None:
    """The inbox page and the answers: approve, deny, resolve, set a variable, revoke a decision."""
    threads = console.threads

    def waiting(session: Session) -> list[dict[str, Any]]:
        caller = session.caller
        entries: list[dict[str, Any]] = []
        with threads.store.read() as tx:
            descriptions: dict[str, dict[str, Any]] = {}
            for call in (PendingCall.of(c) for c in tx.tenant_waiting_calls(caller.tenant, WAITING)):
                run = tx.get_run(call.run_id)
                if run is None:
                    continue
                parent = None
                if run.agent_tool_run_id is not None:
                    row = tx.get_agent_tool_run(run.agent_tool_run_id)
                    parent = row.parent_run_id if row is not None else None
                entries.append(
                    {
                        "call": call,
                        "run": run,
                        "parent_run_id": parent,
                        **answer_context(tx, call, run.agent, descriptions),
                    }
                )
        return entries

    def inbox_page(request: Request, session: Session, notice: Notice | None) -> Response:
        with threads.store.read() as tx:
            grants = tx.tenant_grants(session.caller.tenant)
        return console.render(
            request,
            "inbox.html",
            session=session,
            entries=waiting(session),
            grants=grants,
            notice=notice,
            back="inbox",
        )

    def back_to(
        request: Request, fields: dict[str, str], notice: str | None = None, key: str | None = None
    ) -> Response:
        """Where a form goes back to: the run page its ``back`` names (``run:<id>``), else the
        inbox; with a refusal's notice token, and the refused form's card as the fragment."""
        back = fields.get("back", "")
        run_id = back[len(RUN_BACK) :] if back.startswith(RUN_BACK) else ""
        if re.fullmatch(ID_PATTERN, run_id):
            url = f"{base_of(request)}/runs/{quote(run_id, safe='')}"
        else:
            url = f"{base_of(request)}/inbox"
        if notice is not None:
            url += f"?notice={quote(notice, safe='')}"
            if key is not None:
                url += f"#call-{key}"  # an effect key's characters are all a fragment's
        return RedirectResponse(url, status_code=303)

    @app.get("/inbox", response_class=HTMLResponse, include_in_schema=False)
    def inbox(request: Request, notice: NoticeToken = None) -> Response:
        session = console.session(request)
        return inbox_page(request, session, console.notices.get(session.csrf, notice))

    async def answer(
        request: Request,
        act: Callable[[Session, dict[str, str]], object],
        naming: Callable[[dict[str, str]], str],
        *,
        effect_key: str | None = None,
    ) -> Response:
        """Read and check the form, then ``act`` on it in a worker thread (the store is blocking I/O):
        back to where the form came from, with a notice saying why when it was refused (naming
        what was refused, and keeping the call's form as it was filled in)."""
        session = console.session(request)
        fields = await console.form(request, session)

        def apply() -> Response:
            try:
                act(session, fields)
            except _REFUSALS as exc:
                draft = draft_of(fields) if effect_key is not None else {}
                refused = Notice(f"{naming(fields)}: {_message(exc)}", effect_key, draft)
                return back_to(request, fields, console.notices.put(session.csrf, refused), effect_key)
            return back_to(request, fields)

        return await run_in_threadpool(apply)

    def call_args(stored: str) -> str:
        with threads.store.read() as tx:
            found = tx.get_call_and_run(stored)
        return found[0].args if found is not None else ""

    @app.post("/calls/{effect_key}/approve", include_in_schema=False)
    async def approve(request: Request, effect_key: EffectKey) -> Response:
        def act(session: Session, fields: dict[str, str]) -> None:
            stored = owned_call(threads, session.caller, effect_key)
            edited = fields.get("args")
            override: Any = None
            if edited is not None and edited.strip() and _differs(edited, call_args(stored)):
                try:
                    override = json.loads(edited)
                except ValueError as exc:
                    raise InvalidArguments(f"the edited arguments are not JSON: {exc}") from None
            # Validated as the API's body is, then bound to the approval by the same call.
            body = Approve(override_args=override, remember=fields.get("remember") == "1")
            principal = session.caller.principal
            threads.approve(stored, principal=principal, override_args=body.override_args, remember=body.remember)

        return await answer(request, act, lambda _: effect_key, effect_key=effect_key)

    @app.post("/calls/{effect_key}/deny", include_in_schema=False)
    async def deny(request: Request, effect_key: EffectKey) -> Response:
        def act(session: Session, fields: dict[str, str]) -> None:
            stored = owned_call(threads, session.caller, effect_key)
            body = Deny(reason=fields.get("reason", "").strip() or "denied in the console")
            threads.deny(stored, body.reason, principal=session.caller.principal)

        return await answer(request, act, lambda _: effect_key, effect_key=effect_key)

    @app.post("/calls/{effect_key}/resolve", include_in_schema=False)
    async def resolve(request: Request, effect_key: EffectKey) -> Response:
        def act(session: Session, fields: dict[str, str]) -> None:
            stored = owned_call(threads, session.caller, effect_key)
            reason = fields.get("reason", "").strip()
            if not reason:
                raise ConfigError("say why: a resolution needs a reason")
            body = Resolve.model_validate({"resolution": fields.get("resolution")})
            principal = session.caller.principal
            # assume_done: the reason is what the model is shown as the call's result.
            result = f"assumed done by {principal}: {reason}" if body.resolution == "assume_done" else None
            log.info("console: %s resolves %s as %s: %s", principal, stored, body.resolution, reason)
            threads.resolve(stored, body.resolution, principal=principal, result=result)

        return await answer(request, act, lambda _: effect_key, effect_key=effect_key)

    @app.post("/threads/{thread_id}/env", include_in_schema=False)
    async def set_variable(request: Request, thread_id: ThreadId) -> Response:
        def act(session: Session, fields: dict[str, str]) -> None:
            stored = owned_thread(threads, session.caller, thread_id)
            threads.set_env(stored, fields.get("name", ""), fields.get("value", ""), principal=session.caller.principal)

        # A refusal names the variable, never its value.
        return await answer(request, act, lambda fields: fields.get("name", ""))

    @app.post("/grants/revoke", include_in_schema=False)
    async def revoke(request: Request) -> Response:
        def act(session: Session, fields: dict[str, str]) -> None:
            stored = owned_thread(threads, session.caller, fields.get("thread_id", ""))
            threads.revoke_permission(stored, fields.get("tool", ""), principal=session.caller.principal)

        return await answer(request, act, lambda fields: fields.get("tool", ""))


def answer_context(tx: Tx, call: PendingCall, agent: str, descriptions: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """What a waiting call's forms need (``_call_actions.html``): its arguments as editable text
    and the variables it waits for (``descriptions`` caches the agents' recorded descriptions)."""
    if agent not in descriptions:
        descriptions[agent] = tx.agent_description(agent) or {}
    declared = descriptions[agent].get("variables", {})
    needed = [
        {"name": name, "secret": spec.get("type") == "secret"}
        for name, spec in declared.items()
        if call.status == "awaiting_variable" and name in call.reason.replace(",", " ").split()
    ]
    return {"args": _pretty(call.args), "variables": needed}


def _differs(edited: str, original: str) -> bool:
    """Whether edited arguments differ from the call's (as JSON values, not as texts)."""
    try:
        return bool(json.loads(edited) != json.loads(original))
    except ValueError:
        return edited.strip() != original.strip()


__all__ = ["RUN_BACK", "NoticeToken", "add_routes", "answer_context"]
