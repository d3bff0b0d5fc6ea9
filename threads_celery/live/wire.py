"""What travels on the live bus: one small JSON message per flush of a step's stream.

A message names its run, step and attempt, and holds either the step's next deltas (``d``:
``[kind, part, seq, text, call_id, name]`` each, ``kind`` one of ``t`` text, ``h`` thinking,
``c`` tool-call arguments), or says the attempt's stream ended (``e``: its message is about to be
committed; ``l`` is the seq of its last delta, counting those that were dropped) or is void
(``v``). A nudge (``n``) says the thread committed something: read the store. A subscribing
process's listener hands its subscribers :data:`LOST` when its broker subscription was cut (what
was published meanwhile never reached it). Messages are JSON, like every other thing the project sends, and compact: a flush costs one
``json.dumps`` of a few fragments.

Channels are named after the stored (tenant-scoped) thread id, hashed: a channel name carries no
id, and no caller ever names a channel (the API checks the thread's tenant, then subscribes).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

from pydantic_core import to_json

from threads_celery.live.events import Delta, TextDelta, ThinkingDelta, ToolCallDelta

CHANNEL_PREFIX = "threads-live:"
NUDGE = b'{"n":1}'
LOST = b'{"lost":1}'

#: A fragment as the worker queues it and a message holds it: kind, part, seq, text, call_id, name.
Fragment = tuple[str, int, int, str, str, str]


def channel_for(thread_id: str, namespace: str = "") -> str:
    """The live channel of a stored thread id; ``namespace`` separates ledgers sharing one broker."""
    digest = hashlib.sha256(f"{namespace}\x00{thread_id}".encode()).hexdigest()[:32]
    return CHANNEL_PREFIX + digest


def encode_deltas(run_id: str, step: int, attempt: int, fragments: list[Fragment]) -> bytes:
    # pydantic-core's encoder: a third of json.dumps's time here, on the model turn's thread.
    return to_json({"r": run_id, "s": step, "a": attempt, "d": fragments})


def encode_end(run_id: str, step: int, attempt: int, *, void: bool, last_seq: int = 0) -> bytes:
    if void:
        return to_json({"r": run_id, "s": step, "a": attempt, "v": 1})
    return to_json({"r": run_id, "s": step, "a": attempt, "e": 1, "l": last_seq})


@dataclass(frozen=True, slots=True)
class BusMessage:
    """A decoded message: a nudge, a lost subscription, or the deltas / end / void of one step
    attempt (an end's ``end_seq`` is None from a worker that does not say it)."""

    run_id: str = ""
    step: int = 0
    attempt: int = 0
    fragments: tuple[Fragment, ...] = ()
    ended: bool = False
    void: bool = False
    nudge: bool = False
    lost: bool = False
    end_seq: int | None = None

    @property
    def last_seq(self) -> int:
        return self.fragments[-1][2] if self.fragments else 0

    def deltas(self, after_seq: int = 0) -> list[Delta]:
        """The typed deltas of this message whose seq is above ``after_seq``."""
        out: list[Delta] = []
        for kind, part, seq, text, call_id, name in self.fragments:
            if seq <= after_seq:
                continue
            if kind == "t":
                out.append(TextDelta(self.run_id, self.step, self.attempt, part, seq, text))
            elif kind == "h":
                out.append(ThinkingDelta(self.run_id, self.step, self.attempt, part, seq, text))
            else:
                out.append(ToolCallDelta(self.run_id, self.step, self.attempt, part, seq, call_id, name, text))
        return out


NUDGE_MESSAGE = BusMessage(nudge=True)
LOST_MESSAGE = BusMessage(lost=True)


def decode(payload: bytes | str) -> BusMessage | None:
    """The message in ``payload``; None for anything malformed (a bus is not trusted to be tidy)."""
    try:
        raw: Any = json.loads(payload)
        if not isinstance(raw, dict):
            return None
        if raw.get("n"):
            return NUDGE_MESSAGE
        if raw.get("lost"):
            return LOST_MESSAGE
        run_id, step, attempt = raw["r"], raw["s"], raw["a"]
        if not (isinstance(run_id, str) and type(step) is int and type(attempt) is int):
            return None
        if raw.get("v"):
            return BusMessage(run_id, step, attempt, void=True)
        if raw.get("e"):
            last = raw.get("l")
            return BusMessage(run_id, step, attempt, ended=True, end_seq=last if type(last) is int else None)
        fragments = tuple(_fragment(f) for f in raw["d"])
        return BusMessage(run_id, step, attempt, fragments=fragments)
    except (ValueError, KeyError, TypeError):
        return None


def _fragment(raw: Any) -> Fragment:
    kind, part, seq, text, call_id, name = raw
    if kind not in ("t", "h", "c") or type(part) is not int or type(seq) is not int:
        raise ValueError("not a fragment")
    if not (isinstance(text, str) and isinstance(call_id, str) and isinstance(name, str)):
        raise ValueError("not a fragment")
    return (kind, part, seq, text, call_id, name)


__all__ = ["LOST", "NUDGE", "BusMessage", "Fragment", "channel_for", "decode", "encode_deltas", "encode_end"]
