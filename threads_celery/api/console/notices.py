"""Refused answers, kept on the server for the page the browser is sent back to.

A form the console refuses (edited arguments that fail the tool's schema, a resolution without a
reason) is not answered from the POST: the browser is redirected (303) to the page it came from,
with ``?notice=<token>``, and that GET shows why and the form as the person filled it in. A reload
then repeats the GET, never the POST. The URL holds a random token only: what was typed (arguments
may hold secrets) stays in this process's memory, readable by the session that made it, for
:data:`NOTICE_TTL_S`. A variable's value is never kept.
"""

from __future__ import annotations

import secrets
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

#: How long a refusal and its draft can be shown again (a reload of the page it led to).
NOTICE_TTL_S = 600.0
#: Refusals kept at most (the oldest is forgotten first).
MAX_NOTICES = 1000
#: The fields of a refused form kept as its draft (never a variable's value or the CSRF token).
DRAFT_FIELDS = ("args", "remember", "reason", "resolution")

#: What a page says when its notice is gone (expired, or kept by another process of the console).
GONE = "An answer you gave was refused, and why is no longer known here: give it again."


@dataclass(frozen=True, slots=True)
class Notice:
    """Why an answer was refused, which call's form it came from, and what had been typed."""

    error: str
    effect_key: str | None = None
    draft: Mapping[str, str] = field(default_factory=dict)


class Notices:
    """Refusals by token, each readable only by the session (``owner``) that made it."""

    def __init__(
        self, *, ttl_s: float = NOTICE_TTL_S, limit: int = MAX_NOTICES, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.ttl_s, self.limit, self.clock = ttl_s, limit, clock
        self._lock = threading.Lock()
        self._kept: OrderedDict[str, tuple[float, str, Notice]] = OrderedDict()

    def put(self, owner: str, notice: Notice) -> str:
        """Keep ``notice`` for ``owner``; the token that names it."""
        token = secrets.token_urlsafe(16)
        now = self.clock()
        with self._lock:
            self._forget_expired(now)
            self._kept[token] = (now + self.ttl_s, owner, notice)
            while len(self._kept) > self.limit:
                self._kept.popitem(last=False)
        return token

    def get(self, owner: str, token: str | None) -> Notice | None:
        """The notice ``token`` names, if ``owner`` made it and it has not expired; None if no
        token was given; :data:`GONE` as a notice if it is not (or no longer) here."""
        if not token:
            return None
        with self._lock:
            self._forget_expired(self.clock())
            kept = self._kept.get(token)
        if kept is None or not secrets.compare_digest(kept[1], owner):
            return Notice(GONE)
        return kept[2]

    def _forget_expired(self, now: float) -> None:
        while self._kept:
            token, (until, _, _) = next(iter(self._kept.items()))
            if until > now:
                return
            del self._kept[token]


def draft_of(fields: Mapping[str, str]) -> dict[str, str]:
    """What a refused form's draft keeps of its fields."""
    return {name: fields[name] for name in DRAFT_FIELDS if name in fields}


__all__ = ["DRAFT_FIELDS", "GONE", "MAX_NOTICES", "NOTICE_TTL_S", "Notice", "Notices", "draft_of"]
