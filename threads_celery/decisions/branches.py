"""Where a new branch of a thread's history begins, decided from the messages alone.

A rewind, regenerate, edit or fork keeps a thread's messages up to a point and goes on from
there. What is kept must be a history a model accepts: every call in it has its result. A call
that had none at the point (it waited to run, for a person, or ran) is not copied as pending:
its assistant message is kept without it (and left out if nothing else remains of it), and the
messages after it are kept as copies. :func:`cut_history` says which messages stay as they are,
which are written again, and which calls were dropped; :func:`prior_effects` lists the calls of
the history left behind whose effect may have happened, which the new branch asks a person
about before it calls their tool again. No I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

from threads_celery.records import CallRow, Message, PriorEffect

#: The effects a rewind does not undo and a repeat may double: asked about again.
REPEATABLE_HARM = frozenset({"unguarded", "reconcilable"})


@dataclass(frozen=True, slots=True)
class Cut:
    """The history of a new branch: ``kept`` as it is, then ``rewritten`` (copies to append).

    ``first_left``: the first message of the old history that the branch does not keep as it is
    (None: every message is kept, nothing is superseded). ``left_behind``: those messages.
    ``dropped``: the calls without a result at the point, left out of the new history.
    """

    kept: tuple[Message, ...]
    rewritten: tuple[Message, ...]
    left_behind: tuple[Message, ...]
    dropped: tuple[str, ...]

    @property
    def first_left(self) -> int | None:
        return self.left_behind[0].seq if self.left_behind else None


class BadBranchPoint(ValueError):
    """The point names no message of the thread's current branch."""


def cut_history(messages: Sequence[Message], at: int | None) -> Cut:
    """The branch of ``messages`` (the current branch, in order) that keeps them through ``at``.

    ``at``: the ``seq`` of the last message kept; None keeps none. A point that is not one of
    the messages is :class:`BadBranchPoint`.
    """
    if at is not None and all(m.seq != at for m in messages):
        raise BadBranchPoint(f"message {at} is not on the thread's current branch")
    prefix = [m for m in messages if at is not None and m.seq <= at]
    after = [m for m in messages if at is None or m.seq > at]
    answered = {m.tool_result.call_id for m in prefix if m.tool_result is not None}
    first_open = next(
        (i for i, m in enumerate(prefix) if any(c.id not in answered for c in m.tool_calls)),
        None,
    )
    if first_open is None:
        return Cut(kept=tuple(prefix), rewritten=(), left_behind=tuple(after), dropped=())
    dropped: list[str] = []
    rewritten: list[Message] = []
    for message in prefix[first_open:]:
        calls = tuple(c for c in message.tool_calls if c.id in answered)
        dropped += [c.effect_key for c in message.tool_calls if c.id not in answered]
        if message.tool_calls and not calls and not message.text:
            continue  # nothing of it is left to show the model
        rewritten.append(replace(message, tool_calls=calls))
    return Cut(
        kept=tuple(prefix[:first_open]),
        rewritten=tuple(rewritten),
        left_behind=tuple(prefix[first_open:]) + tuple(after),
        dropped=tuple(dropped),
    )


def effect_keys_of(messages: Iterable[Message]) -> list[str]:
    """The effect keys of the calls ``messages`` asked for, in order."""
    return [c.effect_key for m in messages for c in m.tool_calls if c.effect_key]


def prior_effects(calls: Iterable[CallRow]) -> tuple[PriorEffect, ...]:
    """The calls among ``calls`` (the ledger rows of the history left behind) whose effect may
    have happened and that a repeat could double: an ``unguarded`` or ``reconcilable`` call
    that was claimed (``attempt`` > 0: it ran, or began to). A call that never ran (it waited
    for approval, was denied or skipped) has no effect to repeat."""
    return tuple(
        PriorEffect(effect_key=c.effect_key, tool=c.tool, effect=c.effect, status=c.status)
        for c in calls
        if c.effect in REPEATABLE_HARM and c.attempt > 0
    )


def prior_effect_reason(tool: str, found: Sequence[PriorEffect]) -> str | None:
    """Why a call of ``tool`` on a branch asks first, if the history left behind called it."""
    keys = [p.effect_key for p in found if p.tool == tool]
    if not keys:
        return None
    return (
        f"{tool!r} already ran in the history this branch left behind ({', '.join(keys)}); "
        "its effect is not undone, so a repeat needs approval"
    )


__all__ = [
    "REPEATABLE_HARM",
    "BadBranchPoint",
    "Cut",
    "cut_history",
    "effect_keys_of",
    "prior_effect_reason",
    "prior_effects",
]
