"""What every page of the console shares: the runtime, the callers, the templates, the session check.

Pages are rendered here from Jinja2 templates with autoescaping on: nothing a model, a tool or a
user wrote is ever markup.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from fastapi import Request
from fastapi.responses import HTMLResponse
from jinja2 import Environment, FileSystemLoader

from threads_celery.api.console.notices import Notices
from threads_celery.api.console.session import COOKIE, Session, csrf_ok, verify
from threads_celery.api.tenancy import UNAUTHENTICATED, Caller, shown_to

HERE = Path(__file__).resolve().parent
#: A form body larger than this is refused (the console's forms hold arguments and a reason).
MAX_FORM_BYTES = 1 << 20
SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'"
    ),
    "X-Content-Type-Options": "nosniff",
    # Not no-referrer: under it a browser sends "Origin: null" with its own forms (see same_origin).
    "Referrer-Policy": "same-origin",
    "X-Frame-Options": "DENY",
    "Cache-Control": "no-store",
}


def console_enabled(env: Mapping[str, str]) -> bool:
    """``THREADS_CONSOLE``: on unless set to 0, off or false."""
    return env.get("THREADS_CONSOLE", "").strip().lower() not in ("0", "off", "false", "no")


class SignInRequired(Exception):
    """The request has no valid session: the browser goes to the sign-in page."""


class NotFound(Exception):
    """What an unknown id, or another tenant's, answers: the same page for both. ``what`` ends
    the page's sentence "Not found: there is no ..." (``"call with this effect key"``)."""

    def __init__(self, what: str) -> None:
        super().__init__(what)
        self.what = what


class Console:
    """What every page of the console shares: the runtime, the callers, the templates."""

    def __init__(
        self,
        threads: Any,
        callers: Mapping[str, Caller],
        *,
        auth: bool,
        session_s: float,
        asks_the_app: bool = False,
        csrf_secret: str | None = None,
    ) -> None:
        self.threads = threads
        self.callers = dict(callers)
        self.auth = auth
        self.session_s = session_s
        #: Whether the app's own dependency names each request's caller (``caller=``): no sign-in.
        self.asks_the_app = asks_the_app
        # With authentication off, or done by the app, there is no token to key CSRF tokens by:
        # a key derived from ``csrf_secret`` (shared by every process that has it), else one of
        # this process's own (see session_of_caller).
        self._open_csrf = (
            hashlib.sha256(f"threads-console-csrf:{csrf_secret}".encode()).hexdigest()
            if csrf_secret
            else secrets.token_hex(32)
        )
        # Refused answers, for the page each one's browser is sent back to (POST-redirect-GET).
        self.notices = Notices()
        self.templates = Environment(
            loader=FileSystemLoader(HERE / "templates"),
            autoescape=True,
            trim_blocks=True,
            lstrip_blocks=True,
        )
        self.templates.filters["when"] = when
        self.templates.filters["took"] = took

    @property
    def signs_in(self) -> bool:
        """Whether people sign in here with a token (not when auth is off or the app's own)."""
        return self.auth and not self.asks_the_app

    def session_of_caller(self, caller: Caller) -> Session:
        """The session of a caller the app's own dependency named: its CSRF token is an HMAC of
        who it is, keyed by the console's CSRF key, so it holds for that caller's forms only."""
        who = f"{caller.principal}\n{caller.tenant}".encode()
        return Session(caller, hmac.new(self._open_csrf.encode(), who, hashlib.sha256).hexdigest())

    def session(self, request: Request) -> Session:
        """The request's session; SignInRequired if it has none that is valid now."""
        if self.asks_the_app:
            found: Session | None = getattr(request.state, "console_session", None)
            if found is None:
                raise SignInRequired
            return found
        if not self.auth:
            return Session(UNAUTHENTICATED, self._open_csrf)
        signed = verify(request.cookies.get(COOKIE), self.callers, lifetime_s=self.session_s)
        if signed is None:
            raise SignInRequired
        return signed

    def render(self, request: Request, template: str, status_code: int = 200, **context: Any) -> HTMLResponse:
        session: Session | None = context.pop("session", None)
        page = self.templates.get_template(template).render(
            base=base_of(request),
            session=session,
            shown=shown_to(session.caller) if session is not None else (lambda v: v),
            auth=self.signs_in,
            **context,
        )
        return HTMLResponse(page, status_code=status_code)

    async def form(self, request: Request, session: Session) -> dict[str, str]:
        """The POSTed form's fields (the last of each name), after the CSRF check."""
        if not same_origin(request):
            raise FormRefused(403, "this form did not come from the console")
        body = await request.body()
        if len(body) > MAX_FORM_BYTES:
            raise FormRefused(413, f"the form is larger than {MAX_FORM_BYTES} bytes")
        fields = {k: v[-1] for k, v in parse_qs(body.decode("utf-8", "replace"), keep_blank_values=True).items()}
        if not csrf_ok(session, fields.get("csrf")):
            raise FormRefused(403, "this form is stale or did not come from the console: reload the page")
        return fields


class FormRefused(Exception):
    """A form the console will not act on (no CSRF token, too large)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def same_origin(request: Request) -> bool:
    """Whether a POST came from a page of this host: its ``Origin`` (sent by browsers with every
    POST) names this host, or it has none (a client that is no browser)."""
    origin = request.headers.get("origin")
    if origin is None:
        return True
    return urlsplit(origin).netloc == request.headers.get("host", request.url.netloc)


def base_of(request: Request) -> str:
    """The console's own path prefix (where it is mounted)."""
    return str(request.scope.get("root_path", "")).rstrip("/")


def when(at: datetime | None) -> str:
    """A UTC timestamp as the console shows it, to the millisecond."""
    if at is None:
        return "–"
    return at.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + "Z"


def took(pair: tuple[datetime | None, datetime | None]) -> str:
    """The time between two moments, or a dash when either is missing."""
    start, end = pair
    if start is None or end is None:
        return "–"
    seconds = (end - start).total_seconds()
    return f"{seconds * 1000:.0f} ms" if seconds < 1 else f"{seconds:.2f} s"


__all__ = [
    "HERE",
    "MAX_FORM_BYTES",
    "SECURITY_HEADERS",
    "Console",
    "FormRefused",
    "NotFound",
    "SignInRequired",
    "base_of",
    "console_enabled",
    "same_origin",
    "took",
    "when",
]
