"""What the ledger holds: Unicode text without NUL and without unpaired surrogates.

PostgreSQL refuses a NUL character (U+0000) in ``text`` and in ``json``/``jsonb`` values, and
neither PostgreSQL nor SQLite can encode a lone UTF-16 surrogate (U+D800..U+DFFF, which Python
strings may carry) as UTF-8. A model or a tool can produce either; refusing such output would
leave the run with nothing to record, so the rule is the same on both stores:

    every NUL and every unpaired surrogate written to the ledger is replaced by U+FFFD
    (the Unicode replacement character), everything else is stored as it is.

The rule itself (:func:`~threads_celery.records.storable_text` and
:func:`~threads_celery.records.storable`) is pure and lives with the records, so code above the
store (what a model is shown of a tool's result) applies the same one without loading
SQLAlchemy. The store applies it at one boundary, the engine: :func:`install` cleans every
string parameter of every statement, and :func:`dumps` is the engine's JSON serializer, so a value nested in a
JSON column is cleaned as well. Callers (the HTTP API, :meth:`Threads.start`) refuse such text
outright with :func:`unstorable_reason`, since a person can fix what they send; a model cannot.
"""

from __future__ import annotations

import json
from datetime import date, datetime
from decimal import Decimal
from typing import Any
from uuid import UUID

from sqlalchemy import event
from sqlalchemy.engine import Engine

from threads_celery.records import UNSTORABLE, storable, storable_text


def dumps(value: Any) -> str:
    """The engine's JSON serializer: :func:`json.dumps` of ``value`` made :func:`storable`.

    ``json.dumps`` writes ASCII only, escaping NUL as ``\\u0000`` and every code point of a
    surrogate as ``\\udXXX``; JSON with neither escape came from storable text as it is. The
    value is walked and cleaned only when one appears (a character beyond the BMP, written as
    a surrogate pair, takes that walk too, and is kept).
    """
    text = json.dumps(value)
    if "\\u0000" in text or "\\ud" in text:
        return json.dumps(storable(value))
    return text


def unstorable_reason(text: str) -> str | None:
    """Why a caller's ``text`` cannot be stored as sent (None when it can)."""
    found = UNSTORABLE.search(text)
    if found is None:
        return None
    if found.group() == "\x00":
        return "must not contain a NUL character"
    return f"must not contain an unpaired surrogate (U+{ord(found.group()):04X}); send valid Unicode"


#: Parameter types that hold no text: kept as they are without a look inside.
TEXTLESS = frozenset({int, float, bool, type(None), bytes, datetime, date, Decimal, UUID})


def clean_parameters(parameters: Any) -> Any:
    """``parameters`` (a value, or a dict, tuple or list of them) with every string made storable."""
    kind = type(parameters)
    if kind is dict:  # a statement's parameters: one level, almost always plain values
        return {
            name: value if type(value) in TEXTLESS else clean_parameters(value) for name, value in parameters.items()
        }
    if kind in TEXTLESS:
        return parameters
    if isinstance(parameters, str):
        return storable_text(parameters)
    if isinstance(parameters, dict):
        return {k: clean_parameters(v) for k, v in parameters.items()}
    if isinstance(parameters, tuple):
        return tuple(clean_parameters(v) for v in parameters)
    if isinstance(parameters, list):
        return [clean_parameters(v) for v in parameters]
    return parameters


def install(engine: Engine) -> None:
    """Apply the rule to every statement ``engine`` runs (string parameters; JSON goes through :func:`dumps`)."""

    @event.listens_for(engine, "before_cursor_execute", retval=True)
    def _storable_parameters(
        conn: Any, cursor: Any, statement: str, parameters: Any, context: Any, executemany: bool
    ) -> tuple[str, Any]:
        return statement, clean_parameters(parameters)
