"""The provider emulator's scripted replies: what a reply may say, checked once, and the tokens a
reply is billed (about four characters a token, as a real tokenizer roughly counts, unless the
script sets ``usage``). See :mod:`threads_celery.provider_emulator` for the keys and their meaning.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

Reply = Mapping[str, Any] | str
Script = Sequence[Reply] | Callable[[dict[str, Any]], Reply]

_REPLY_KEYS = frozenset(
    {
        "text",
        "tool_calls",
        "finish_reason",
        "usage",
        "delay",
        "chunk_delay",
        "abort_after",
        "error",
        "status",
        "retry_after",
    }
)


@dataclass(frozen=True, slots=True)
class BilledRequest:
    """One request the emulator answered and so billed, with the tokens it charged.

    ``delivered`` says whether the whole answer went out (a stream cut with ``abort_after``, or
    one whose client went away, is billed and not delivered).
    """

    number: int
    model: str
    prompt_tokens: int
    completion_tokens: int
    stream: bool
    delivered: bool


class ScriptError(Exception):
    """The scripted reply could not be produced; answered as HTTP 400."""


def split_fragments(value: str, size: int) -> list[str]:
    """Split ``value`` into consecutive pieces of at most ``size`` characters."""
    if size < 1:
        raise ValueError("size must be >= 1")
    return [value[i : i + size] for i in range(0, len(value), size)]


def _estimate_tokens(text: str) -> int:
    return math.ceil(len(text) / 4) if text else 0


def _prompt_tokens(body: Mapping[str, Any]) -> int:
    total = 0
    for message in body.get("messages") or []:
        content = message.get("content") if isinstance(message, Mapping) else None
        if isinstance(content, str):
            total += _estimate_tokens(content)
        elif isinstance(content, list):
            for part in content:
                if isinstance(part, Mapping) and isinstance(part.get("text"), str):
                    total += _estimate_tokens(part["text"])
        total += 4  # per-message overhead, roughly like the real tokenizer accounting
    return max(total, 1)


class NormalizedReply:
    """One scripted reply, checked and with its defaults filled in."""

    __slots__ = (
        "abort_after",
        "chunk_delay",
        "delay",
        "error",
        "finish_reason",
        "retry_after",
        "status",
        "text",
        "tool_calls",
        "usage_override",
    )  # fmt: skip

    def __init__(self, raw: Reply, call_counter: Iterator[int]) -> None:
        if isinstance(raw, str):
            raw = {"text": raw}
        if not isinstance(raw, Mapping):
            raise ScriptError(f"a scripted reply must be a mapping or a string, got {type(raw).__name__}")
        unknown = set(raw) - _REPLY_KEYS
        if unknown:
            raise ScriptError(f"unknown keys in scripted reply: {sorted(unknown)}")

        self.error: str | None = None
        self.status = int(raw.get("status", 500))
        if "error" in raw:
            self.error = str(raw["error"])
        elif "status" in raw:
            raise ScriptError("'status' is only meaningful together with 'error'")
        self.retry_after: str | None = str(raw["retry_after"]) if "retry_after" in raw else None
        if self.retry_after is not None and self.error is None:
            raise ScriptError("'retry_after' is only meaningful together with 'error'")

        text = raw.get("text")
        if text is not None and not isinstance(text, str):
            raise ScriptError("'text' must be a string")
        self.text: str | None = text

        self.tool_calls: list[dict[str, str]] = []
        for call in raw.get("tool_calls") or []:
            if not isinstance(call, Mapping) or not isinstance(call.get("name"), str):
                raise ScriptError(f"each tool call needs a string 'name': {call!r}")
            arguments = call.get("arguments", "{}")
            if not isinstance(arguments, str):
                arguments = json.dumps(arguments)
            call_id = call.get("id") or f"call_{next(call_counter)}"
            self.tool_calls.append({"id": str(call_id), "name": call["name"], "arguments": arguments})

        if self.error is None and self.text is None and not self.tool_calls:
            raise ScriptError("a scripted reply needs 'text', 'tool_calls' or 'error'")

        self.finish_reason: str = raw.get("finish_reason") or ("tool_calls" if self.tool_calls else "stop")
        self.usage_override: Mapping[str, int] = raw.get("usage") or {}
        self.delay = float(raw.get("delay", 0) or 0)
        self.chunk_delay = float(raw.get("chunk_delay", 0) or 0)
        abort_after = raw.get("abort_after")
        self.abort_after: int | None = None if abort_after is None else int(abort_after)

    def usage(self, body: Mapping[str, Any]) -> dict[str, int]:
        completion = _estimate_tokens(self.text or "") + sum(
            _estimate_tokens(c["name"]) + _estimate_tokens(c["arguments"]) for c in self.tool_calls
        )
        prompt = int(self.usage_override.get("prompt_tokens", _prompt_tokens(body)))
        completion = int(self.usage_override.get("completion_tokens", completion))
        return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


__all__ = ["BilledRequest", "NormalizedReply", "Reply", "Script", "ScriptError", "split_fragments"]
