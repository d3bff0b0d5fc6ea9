"""What the ledger holds: Unicode text without NUL and without unpaired surrogates.

PostgreSQL refuses a NUL character (U+0000) in ``text`` and in ``json``/``jsonb`` values, and
neither PostgreSQL nor SQLite can encode a lone UTF-16 surrogate (U+D800..U+DFFF, which Python
strings may carry) as UTF-8. A model or a tool can produce either; refusing such output would
leave the run with nothing to record, so the rule is the same on both stores:

    every NUL and every unpaired surrogate written to the ledger is replaced by U+FFFD
    (the Unicode replacement character), everything else is stored as it is.

The rule is applied at one boundary, the engine: :func:`install` cleans every string parameter
of every statement, and :func:`dumps` is the engine's JSON serializer, so a value nested in a
JSON column is cleaned as well. Callers (the HTTP API, :meth:`Threads.start`) refuse such text
outright with :func:`unstorable_reason`, since a person can fix what they send; a model cannot.
"""

from __future__ import annotations

import json
import re
from typing import Any

from sqlalchemy import event
from sqlalchemy.engine import Engine

#: A character the ledger cannot hold: NUL, or any surrogate (Python strings hold only unpaired ones).
UNSTORABLE = re.compile("[\x00\ud800-\udfff]")
REPLACEMENT = "\ufffd"


def storable_text(text: str) -> str:
    """``text`` with every NUL and unpaired surrogate replaced by U+FFFD."""
    if text.isascii() and "\x00" not in text:
        return text
    return UNSTORABLE.sub(REPLACEMENT, text)


def storable(value: Any) -> Any:
    """``value`` (a JSON-like structure) with :func:`storable_text` applied to every string, keys too."""
    if isinstance(value, str):
        return storable_text(value)
    if isinstance(value, dict):
        return {storable(k): storable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [storable(v) for v in value]
    return value


def dumps(value: Any) -> str:
    """The engine's JSON serializer: :func:`storable` first, then :func:`json.dumps`."""
    return json.dumps(storable(value))


def unstorable_reason(text: str) -> str | None:
    """Why a caller's ``text`` cannot be stored as sent (None when it can)."""
    found = UNSTORABLE.search(text)
    if found is None:
        return None
    if found.group() == "\x00":
        return "must not contain a NUL character"
    return f"must not contain an unpaired surrogate (U+{ord(found.group()):04X}); send valid Unicode"


def _clean_parameters(parameters: Any) -> Any:
    if isinstance(parameters, str):
        return storable_text(parameters)
    if isinstance(parameters, dict):
        return {k: _clean_parameters(v) for k, v in parameters.items()}
    if isinstance(parameters, tuple):
        return tuple(_clean_parameters(v) for v in parameters)
    if isinstance(parameters, list):
        return [_clean_parameters(v) for v in parameters]
    return parameters


def install(engine: Engine) -> None:
    """Apply the rule to every statement ``engine`` runs (string parameters; JSON goes through :func:`dumps`)."""

    @event.listens_for(engine, "before_cursor_execute", retval=True)
    def _storable_parameters(
        conn: Any, cursor: Any, statement: str, parameters: Any, context: Any, executemany: bool
    ) -> tuple[str, Any]:
        return statement, _clean_parameters(parameters)
