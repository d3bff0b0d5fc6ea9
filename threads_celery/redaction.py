"""Redaction of secret values in every form a tool's output or log line can carry them.

A secret read by a tool (``ctx.env`` on a ``secret`` variable) must not reach the model, the
store, an event, an error message or a log line. Looking for the raw value only is not enough:
JSON escapes a newline as ``\\n``, ``repr`` escapes a backslash, ``ascii()`` and
``ensure_ascii`` turn ``é`` into ``\\xe9`` or ``\\u00e9``, and a PEM key in a traceback may
appear one line at a time. So a value is redacted twice: as data, before it is serialised
(:func:`redact_value` walks results), and as text, after (:func:`redact_text` replaces every
rendered form :func:`rendered_forms` knows).

While a tool call runs, the secrets it revealed are *active* in its process
(:func:`secrets_active`), and once it has ended they are *remembered* (the most recent
:data:`REMEMBER_AT_MOST`): a thread the tool left behind may log later, a child process may still
print. :func:`install_log_redaction` makes every log record created in the process, whoever logs
it (the runtime, Celery, the tool's own ``logging``), carry text redacted of both, and wraps
``sys.stdout``/``sys.stderr`` so that a tool's ``print`` is redacted too. A worker's pool process
also passes its file descriptors 1 and 2 through a redacting pipe
(:mod:`threads_celery.worker.output_capture`), for ``os.write`` and subprocesses.

What this cannot catch: a tool that deliberately re-encodes a secret (base64, hashing, splitting
it into pieces shorter than :data:`MIN_FRAGMENT`) before returning or logging it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import html
import json
import logging
import re
import shlex
import sys
import threading
import traceback
import urllib.parse
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, TextIO

from pydantic import BaseModel, ValidationError

REDACTED = "***"
#: Lines (and other fragments) of a multi-line secret shorter than this are not redacted on
#: their own: a two-letter line would blank out every occurrence of those letters.
MIN_FRAGMENT = 6

_ESCAPES: tuple[Callable[[str], str], ...] = (
    lambda s: json.dumps(s)[1:-1],  # JSON, non-ASCII as \uXXXX
    lambda s: json.dumps(s, ensure_ascii=False)[1:-1],  # JSON, non-ASCII kept
    lambda s: repr(s)[1:-1],  # Python repr, as exception messages and f"{x!r}" show it
    lambda s: ascii(s)[1:-1],  # repr with non-ASCII as \xe9 / \u20ac
    lambda s: s.encode("unicode_escape").decode("ascii"),  # repr body without quote escapes
    lambda s: s.encode("unicode_escape").decode("ascii").replace("'", "\\'").replace('"', '\\"'),
    lambda s: repr(s.encode("utf-8"))[2:-1],  # bytes repr: b'\xc3\xa9'
    lambda s: s.encode("utf-8").decode("latin-1"),  # UTF-8 read back as Latin-1 (mojibake)
    lambda s: urllib.parse.quote(s, safe=""),
    lambda s: urllib.parse.quote_plus(s, safe=""),
    lambda s: html.escape(s),  # HTML/XML named entities (&amp; &lt; &quot; &#x27;)
    lambda s: html.escape(s, quote=False),
    lambda s: "".join(f"&#{ord(c)};" for c in s),  # every character as a decimal entity
    lambda s: "".join(f"&#x{ord(c):x};" for c in s),  # every character as a hex entity
    lambda s: s.replace('"', '""'),  # CSV quoted field
    lambda s: s.replace("'", "''"),  # YAML single-quoted scalar, SQL literal
    lambda s: shlex.quote(s),  # shell: '...'"'"'...'
    lambda s: "".join("\\" + c if not c.isalnum() else c for c in s),  # shell backslash escaping
)


@functools.lru_cache(maxsize=512)
def rendered_forms(secret: str) -> tuple[str, ...]:
    """Every form of ``secret`` to look for, longest first.

    The raw value, each escaping above applied once and twice (a JSON string inside a JSON
    document, a ``repr`` of JSON), and the same for each line of a multi-line secret (lines of at
    least :data:`MIN_FRAGMENT` characters, with and without surrounding whitespace).
    """
    if not secret:
        return ()
    pieces = {secret}
    if "\n" in secret or "\r" in secret:
        for line in secret.splitlines():
            for piece in (line, line.strip()):
                if len(piece) >= MIN_FRAGMENT:
                    pieces.add(piece)
    forms: set[str] = set()
    for piece in pieces:
        once = {piece} | {escape(piece) for escape in _ESCAPES}
        forms |= once
        twice = {escape(form) for form in once for escape in _ESCAPES}
        forms |= twice
        # JSON inside JSON inside JSON (an event payload holding a tool result holding a JSON
        # string): backslashes multiply with each level.
        forms |= {_ESCAPES[0](form) for form in twice} | {_ESCAPES[1](form) for form in twice}
    forms = {f for f in forms if f == secret or len(f) >= min(MIN_FRAGMENT, len(secret))}
    return tuple(sorted(forms, key=len, reverse=True))


#: A secret cut short for display keeps this much of its head or tail at most (pydantic shows 25
#: characters a side, ``reprlib`` fewer); a fragment of at least MIN_FRAGMENT characters next to
#: an ellipsis is redacted.
_TRUNCATED_SIDE = 64
_ELLIPSES = ("...", "\u2026")
#: How many leading characters of a form file it (see :class:`Redactor`).
_ANCHOR = 4


def redact_text(text: str, secrets: Iterable[str]) -> str:
    """``text`` with every rendered form of every secret replaced by ``***``.

    Also a long secret cut short for display (``'sk-live-abcdef...uvwxyz'``, ``sk-live-ab…``): a
    head of it just before an ellipsis, or a tail just after one, is redacted too.
    """
    if not text:
        return text
    redactor = redactor_for(frozenset(secrets))
    return redactor.redact(text) if redactor is not None else text


class Redactor:
    """Finds every form of a set of secrets in a text in one pass (see :func:`redactor_for`).

    A secret has dozens to hundreds of forms, and a worker may remember hundreds of secrets, so
    looking for each form in turn, or compiling them all into one regular expression (about a
    second for one PEM key), is too slow. Instead each form is filed under its first
    :data:`_ANCHOR` characters; one small regular expression of those anchors finds the few places
    where a form could start, and only there are the forms compared, the longest first.
    """

    def __init__(self, forms: Iterable[str], heads: Iterable[str], tails: Iterable[str]) -> None:
        #: anchor -> (form, whether it counts only right before an ellipsis), the longest first
        self._filed: dict[str, list[tuple[str, bool]]] = {}
        for form, before_ellipsis in [*((f, False) for f in set(forms)), *((h, True) for h in set(heads))]:
            self._filed.setdefault(form[:_ANCHOR], []).append((form, before_ellipsis))
        for candidates in self._filed.values():
            candidates.sort(key=lambda c: (len(c[0]), not c[1]), reverse=True)
        self._anchor_lengths = sorted({len(a) for a in self._filed}, reverse=True)
        self._anchors = re.compile("|".join(re.escape(a) for a in sorted(self._filed, key=len, reverse=True)))
        self._tails = sorted(set(tails), key=len, reverse=True)
        #: The longest form: a stream that redacts as it goes holds back this much of its tail.
        self.longest = max((len(c[0]) for cs in self._filed.values() for c in cs), default=0) + 3

    def redact(self, text: str) -> str:
        """``text`` with every form replaced by ``***``."""
        spans = self.spans(text)
        if not spans:
            return text
        pieces, at = [], 0
        for start, end in spans:
            pieces += [text[at:start], REDACTED]
            at = end
        pieces.append(text[at:])
        return "".join(pieces)

    def spans(self, text: str) -> list[tuple[int, int]]:
        """Where the forms are in ``text`` (start, end), left to right, the longest at each place."""
        spans: list[tuple[int, int]] = []
        found = self._anchors.search(text)
        while found is not None:
            at = found.start()
            end = self._match_at(text, at)
            if end is None:
                found = self._anchors.search(text, at + 1)
                continue
            spans.append((at, end))
            found = self._anchors.search(text, end)
        if self._tails and ("..." in text or "\u2026" in text):
            spans = self._with_tails(text, spans)
        return spans

    def _match_at(self, text: str, at: int) -> int | None:
        best: int | None = None
        for length in self._anchor_lengths:
            for form, before_ellipsis in self._filed.get(text[at : at + length], ()):
                if best is not None and at + len(form) <= best:
                    break
                if text.startswith(form, at) and (not before_ellipsis or text.startswith(_ELLIPSES, at + len(form))):
                    best = at + len(form)
                    break
        return best

    def _with_tails(self, text: str, spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
        """Add each tail of a secret just after an ellipsis that no span covers yet."""
        added = []
        for ellipsis in _ELLIPSES:
            at = text.find(ellipsis)
            while at != -1:
                start = at + len(ellipsis)
                if not any(s <= start < e for s, e in spans):
                    tail = next((t for t in self._tails if text.startswith(t, start)), None)
                    if tail is not None:
                        added.append((start, start + len(tail)))
                at = text.find(ellipsis, start)
        return sorted(spans + added)


@functools.lru_cache(maxsize=512)
def redactor_for(secrets: frozenset[str]) -> Redactor | None:
    """The :class:`Redactor` of ``secrets``, built once per set (None for no secret)."""
    secrets = frozenset(s for s in secrets if s)
    if not secrets:
        return None
    forms = {f for s in secrets for f in rendered_forms(s)}
    heads: set[str] = set()
    tails: set[str] = set()
    for secret in secrets:
        if "\n" in secret or len(secret) <= MIN_FRAGMENT:
            continue
        for body in {secret, repr(secret)[1:-1]}:
            for k in range(MIN_FRAGMENT, min(len(body) - 1, _TRUNCATED_SIDE) + 1):
                heads.add(body[:k])
                tails.add(body[-k:])
    return Redactor(forms, heads, tails)


def redact_value(value: Any, secrets: Sequence[str]) -> Any:
    """``value`` with secrets redacted in every string inside it, before it is serialised.

    Walks mappings (keys too), sequences, sets, pydantic models and dataclasses; a model or a
    dataclass comes back as the plain data it would have been serialised as. Other objects are
    left to :func:`redact_text` on their rendered form.
    """
    if not secrets:
        return value
    if isinstance(value, str):
        return redact_text(value, secrets)
    if isinstance(value, bytes):
        try:
            return redact_text(value.decode("utf-8"), secrets).encode("utf-8")
        except UnicodeDecodeError:
            return value
    if isinstance(value, BaseModel):
        return redact_value(value.model_dump(mode="json"), secrets)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return redact_value(dataclasses.asdict(value), secrets)
    if isinstance(value, dict):
        return {redact_value(k, secrets): redact_value(v, secrets) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return (
            type(value)(redact_value(v, secrets) for v in value)
            if type(value) in (list, tuple)
            else [redact_value(v, secrets) for v in value]
        )
    if isinstance(value, (set, frozenset)):
        return [redact_value(v, secrets) for v in value]
    return value


def describe_exception(exc: BaseException, secrets: Sequence[str]) -> str:
    """``"<Type>: <message>"`` for a tool's failure, with every form of every secret redacted.

    Never raises, whatever the exception's ``__str__``, ``__repr__`` or arguments do. A pydantic
    ``ValidationError`` is rendered without the input values (pydantic shortens a long input to
    ``'sk-live-abcdef...wxyz'``, which exact-match redaction cannot find). Other messages are
    built from the exception's arguments after they were redacted as values (a ``KeyError(secret)``
    shows the ``repr`` of its argument), then redacted again as text.
    """
    try:
        return redact_text(f"{_type_name(exc)}: {_message(exc, secrets)}", secrets)
    except BaseException:  # noqa: BLE001 - describing a failure must never fail
        return f"{_type_name(exc)}: <unprintable exception>"


def _type_name(exc: BaseException) -> str:
    try:
        name = type(exc).__name__
        return name if type(name) is str else "Exception"
    except BaseException:  # noqa: BLE001 - a metaclass can make even the name raise
        return "Exception"


def _message(exc: BaseException, secrets: Sequence[str]) -> str:
    if isinstance(exc, ValidationError):
        return _validation_message(exc)
    try:
        message = str(exc)
    except BaseException:  # noqa: BLE001 - a hostile __str__ may raise anything
        message = "<unprintable exception>"
    if secrets and exc.args:
        try:
            clean_args = redact_value(list(exc.args), secrets)
            if clean_args != list(exc.args):
                rebuilt = type(exc).__new__(type(exc))
                rebuilt.args = tuple(clean_args)
                message = str(rebuilt)
        except Exception:  # noqa: BLE001 - exceptions whose __str__ needs their own fields
            pass  # the message from str() above is redacted as text
    return message if isinstance(message, str) else "<unprintable exception>"


def _validation_message(exc: ValidationError) -> str:
    """A ``ValidationError`` as pydantic prints it, minus every input value and URL."""
    try:
        errors = exc.errors(include_input=False, include_url=False, include_context=False)
    except Exception:  # noqa: BLE001 - a subclass with its own errors(): keep only the count
        return "validation failed"
    lines = [f"{len(errors)} validation error{'s' if len(errors) != 1 else ''} for {exc.title}"]
    for error in errors:
        location = ".".join(str(part) for part in error.get("loc", ())) or "(root)"
        lines.append(f"{location}\n  {error.get('msg', '')} [type={error.get('type', '')}]")
    return "\n".join(lines)


# -- the process's active and remembered secrets ---------------------------------------------

_lock = threading.Lock()
_active: dict[int, list[str]] = {}
#: Secrets revealed to tool calls that have ended, the most recent last (see remember_secrets).
_remembered: dict[str, None] = {}
#: How many ended calls' secrets a process keeps redacting: a worker serving many tenants
#: forgets the least recently revealed first.
REMEMBER_AT_MOST = 256


def known_secrets() -> list[str]:
    """Every secret this process must keep out of what it writes: those of the calls running
    now and the :data:`REMEMBER_AT_MOST` most recently revealed to calls that have ended.

    A tool's call may end while something it started goes on: a thread that logs later, a child
    process that prints, output still in a pipe. What they write is redacted all the same.
    """
    with _lock:
        if not _remembered:
            return [s for revealed in _active.values() for s in revealed]
        return list({**_remembered, **{s: None for revealed in _active.values() for s in revealed}})


def remember_secrets(secrets: Iterable[str]) -> None:
    """Keep redacting ``secrets`` from this process's logs and output after their call ended."""
    with _lock:
        for secret in secrets:
            if secret:
                _remembered.pop(secret, None)
                _remembered[secret] = None
        while len(_remembered) > REMEMBER_AT_MOST:
            del _remembered[next(iter(_remembered))]


@contextlib.contextmanager
def secrets_active(revealed: list[str]) -> Iterator[None]:
    """While inside, every value appended to ``revealed`` is redacted from logs and stdout; after,
    they are remembered (:func:`known_secrets`).

    ``revealed`` is watched, not copied: a secret the tool reads halfway through its call is
    covered from that moment on.
    """
    key = id(revealed)
    with _lock:
        _active[key] = revealed
    try:
        yield
    except BaseException as exc:
        # What escapes the call (a SystemExit, a worker shutdown) is logged by Celery after
        # this scope ends: scrub the secrets out of it now.
        scrub_exception(exc, revealed)
        raise
    finally:
        remember_secrets(revealed)
        with _lock:
            _active.pop(key, None)


def scrub_exception(exc: BaseException, secrets: Sequence[str]) -> None:
    """Redact ``secrets`` from the arguments of ``exc`` and of its causes and contexts, in place."""
    if not secrets:
        return
    seen: set[int] = set()
    pending = [exc]
    while pending:
        current = pending.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        with contextlib.suppress(Exception):  # an exception type that refuses new args stays as it is
            current.args = tuple(redact_value(list(current.args), secrets))
        pending.extend(e for e in (current.__cause__, current.__context__) if e is not None)


# -- logs and standard streams ---------------------------------------------------------------

_installed = False
_exception_formatter = logging.Formatter()


def _redacting_factory(previous: Callable[..., logging.LogRecord]) -> Callable[..., logging.LogRecord]:
    def make_record(*args: Any, **kwargs: Any) -> logging.LogRecord:
        record = previous(*args, **kwargs)
        secrets = known_secrets()
        if secrets:
            redact_record(record, secrets)
        return record

    return make_record


def redact_record(record: logging.LogRecord, secrets: Sequence[str]) -> None:
    """Rewrite ``record`` in place so that no handler can format a secret out of it."""
    try:
        message = record.getMessage()
    except Exception:  # noqa: BLE001 - a bad format string: keep what there is, redacted
        message = str(record.msg)
    record.msg, record.args = redact_text(message, secrets), ()
    if record.exc_info:
        text = record.exc_text or _exception_formatter.formatException(record.exc_info)
        record.exc_text = redact_text(text, secrets)
        # The formatted text replaces the live exception: a handler that formats exc_info
        # itself (instead of using exc_text) would see the secret again.
        record.exc_info = None
    elif record.exc_text:
        record.exc_text = redact_text(record.exc_text, secrets)
    if record.stack_info:
        record.stack_info = redact_text(record.stack_info, secrets)


class RedactingStream:
    """A text stream that redacts the known secrets (:func:`known_secrets`) from everything written to it."""

    def __init__(self, stream: TextIO) -> None:
        self.wrapped = stream

    def write(self, text: str) -> int:
        """Write ``text`` with the known secrets redacted; returns the length given."""
        secrets = known_secrets()
        self.wrapped.write(redact_text(text, secrets) if secrets and isinstance(text, str) else text)
        return len(text)

    def writelines(self, lines: Iterable[str]) -> None:
        """Write each line through :meth:`write`."""
        for line in lines:
            self.write(line)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.wrapped, name)


def install_log_redaction() -> None:
    """Redact the active secrets from every log record and from ``print`` in this process.

    Idempotent; called by the runtime before a tool call runs, so every worker process (prefork
    child, thread pool, embedded) has it before any tool code does.
    """
    global _installed
    with _lock:
        first, _installed = not _installed, True
    if first:
        logging.setLogRecordFactory(_redacting_factory(logging.getLogRecordFactory()))
    # Checked on every call: whoever replaced a stream since (a test harness, a daemoniser)
    # gets wrapped again.
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if stream is not None and not isinstance(stream, RedactingStream):
            setattr(sys, name, RedactingStream(stream))


def format_exception_redacted(exc: BaseException, secrets: Sequence[str]) -> str:
    """A traceback of ``exc`` with every form of every secret redacted."""
    return redact_text("".join(traceback.format_exception(exc)), secrets)


def redacting(function: Callable[..., Any], revealed: Sequence[str]) -> Callable[..., Any]:
    """``function`` with every argument redacted of ``revealed`` secrets at call time.

    For what a tool sends out of its call other than its result: progress reports (which become
    events and the parent's snapshot) and the input of children it starts.
    """

    def call(*args: Any, **kwargs: Any) -> Any:
        if revealed:
            args = tuple(redact_value(list(args), revealed))
            kwargs = {k: redact_value(v, revealed) for k, v in kwargs.items()}
        return function(*args, **kwargs)

    return call
