"""Variables: per-thread values that tools read with ``ctx.env(name)``, secrets encrypted at rest.

Values are given per thread (``Threads.start(..., env={...})``, ``Threads.set_env``) and flow
down to descendant threads, except that a thread whose agent declares a variable ``scoped``
does not inherit that name from its parent; what is provided in that thread still flows down to
its own subtree. A required variable with no value makes the run wait (``awaiting_variable``)
until one is set. Secret values are Fernet-encrypted with ``THREADS_SECRET_KEY`` and never leave
the store in clear except into the tool that declared them.

Here are the declarations, the secret box and the pure rule that finds a value along a chain of
threads (:func:`resolve`); reading that chain from the ledger for one tool call is the runtime's
part (:class:`threads_celery.runtime.variables.ThreadEnv`).
"""

from __future__ import annotations

import base64
import binascii
import os
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Literal

from cryptography.fernet import Fernet, InvalidToken, MultiFernet

from threads_celery.exceptions import ConfigError, SecretUndecryptable, ThreadsError
from threads_celery.redaction import redact_text

VARIABLE_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
SECRET_KEY_ENV = "THREADS_SECRET_KEY"
REDACTED = "***"


class VariableError(ThreadsError, LookupError):
    """A variable was read that the tool did not declare, or a secret outside a tool."""


@dataclass(frozen=True, slots=True)
class Variable:
    """A value a tool, prompt or agent needs from its thread's environment."""

    name: str
    type: Literal["text", "secret"] = "text"
    required: bool = False
    scoped: bool = False
    description: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not VARIABLE_NAME.match(self.name):
            raise ConfigError(f"variable name {self.name!r} is invalid: letters, digits and underscores")
        if self.type not in ("text", "secret"):
            raise ConfigError(f"variable {self.name!r}: type must be 'text' or 'secret', not {self.type!r}")


def declared(variables: Iterable[Variable]) -> dict[str, Variable]:
    """Declarations by name, merged: required or scoped anywhere counts; types must agree."""
    found: dict[str, Variable] = {}
    for variable in variables:
        if not isinstance(variable, Variable):
            raise ConfigError(f"variables must be Variable(...) values, not {type(variable).__name__}")
        other = found.get(variable.name)
        if other is None:
            found[variable.name] = variable
            continue
        if other.type != variable.type:
            raise ConfigError(f"variable {variable.name!r} is declared both {other.type} and {variable.type}")
        found[variable.name] = Variable(
            variable.name,
            variable.type,
            required=other.required or variable.required,
            scoped=other.scoped or variable.scoped,
            description=other.description or variable.description,
        )
    return found


_KEY_HELP = (
    "generate one with: python -c 'from cryptography.fernet import Fernet; print(Fernet.generate_key().decode())'"
)


def parse_secret_keys(raw: str) -> MultiFernet:
    """The cipher of a ``THREADS_SECRET_KEY`` value, or a ConfigError that never repeats the value.

    The value is one Fernet key (32 url-safe base64 bytes), or several separated by commas for a
    rotation: new secrets are sealed with the first, and stored ones open with any of them.
    """
    parts = [part.strip() for part in raw.split(",")]
    if not raw.strip() or any(not part for part in parts):
        raise ConfigError(f"{SECRET_KEY_ENV} is empty or has an empty entry ({_KEY_HELP})")
    ciphers = []
    for position, part in enumerate(parts, start=1):
        try:
            # Strictly: Fernet itself ignores what follows the padding, so a key with junk
            # appended (a paste gone wrong) would pass and seal with a key nobody wrote down.
            if len(base64.b64decode(part.encode("ascii"), altchars=b"-_", validate=True)) != 32:
                raise ValueError("not 32 bytes")
            ciphers.append(Fernet(part.encode()))
        except (ValueError, TypeError, UnicodeEncodeError, binascii.Error):
            which = f"key {position} of {len(parts)}" if len(parts) > 1 else "it"
            # Never the value itself: a malformed key is often a real key cut short.
            raise ConfigError(
                f"{SECRET_KEY_ENV} is not a valid Fernet key ({which} is not 32 url-safe base64 bytes; {_KEY_HELP})"
            ) from None
    return MultiFernet(ciphers)


def check_secret_key(environ: Mapping[str, str] | None = None) -> None:
    """Refuse a malformed ``THREADS_SECRET_KEY`` (ConfigError); an unset one is fine until a
    secret is stored or read. What the worker, Beat and the API check before they start."""
    raw = (os.environ if environ is None else environ).get(SECRET_KEY_ENV)
    if raw is not None:
        parse_secret_keys(raw)


class SecretBox:
    """Encrypts and decrypts secret values with the key from ``THREADS_SECRET_KEY``."""

    def __init__(self, key: str | None = None) -> None:
        self._key = key if key is not None else os.environ.get(SECRET_KEY_ENV)
        self._fernet: MultiFernet | None = None

    def _cipher(self) -> MultiFernet:
        if self._fernet is None:
            if not self._key:
                raise ConfigError(f"cannot store a secret: {SECRET_KEY_ENV} is not set ({_KEY_HELP})")
            self._fernet = parse_secret_keys(self._key)
        return self._fernet

    def seal(self, value: str) -> str:
        return self._cipher().encrypt(value.encode()).decode()

    def open(self, token: str, *, name: str | None = None) -> str:
        """The clear value of a sealed secret; :class:`SecretUndecryptable` when no key opens it."""
        try:
            return self._cipher().decrypt(token.encode()).decode()
        except (InvalidToken, UnicodeError):
            raise SecretUndecryptable(name) from None


def redact(text: str, secrets: Iterable[str]) -> str:
    """``text`` with every given secret value replaced by ``***``, in every rendered form.

    See :func:`threads_celery.redaction.redact_text` (raw, JSON-escaped, ``repr``, each line).
    """
    return redact_text(text, secrets)


def resolve(
    name: str,
    chain: list[tuple[Mapping[str, tuple[str, str]], Callable[[str], bool]]],
) -> tuple[str, str] | None:
    """The (type, stored value) of ``name`` for the first thread of ``chain`` that has one.

    ``chain`` runs from the thread itself up to the root: each entry is that thread's stored
    values and whether its agent declares ``name`` scoped (a scoped thread does not look further
    up). Pure: the caller loads the chain.
    """
    for values, is_scoped in chain:
        if name in values:
            return values[name]
        if is_scoped(name):
            return None
    return None
