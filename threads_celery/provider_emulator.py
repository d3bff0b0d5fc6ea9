"""A provider emulator: an OpenAI-compatible Chat Completions server on loopback that bills.

Point an OpenAI client (the ``openai`` SDK, pydantic-ai's ``OpenAIChatModel``, a model string with
``OPENAI_BASE_URL`` set, or a worker process started with that variable) at
:attr:`ProviderEmulator.base_url`, and decide in advance what the "model" answers::

    from threads_celery.testing import ProviderEmulator

    script = [
        {"tool_calls": [{"id": "call_1", "name": "get_weather", "arguments": '{"city": "Paris"}'}]},
        {"text": "It is sunny in Paris."},
    ]
    with ProviderEmulator(script) as provider:
        client = openai.OpenAI(base_url=provider.base_url, api_key="test")
        ...
        assert len(provider.billed) == 2

Like a real provider it keeps a ledger of what it billed (:attr:`ProviderEmulator.billed`): every
request it answered, with the tokens it charged, whether or not the client read the whole answer.
A run's usage can then be held against what the provider says it is owed: a request answered and
then thrown away by the client (a worker killed before it committed the step, a client bound to
another event loop) is on the ledger all the same.

``script`` is either a sequence of replies, consumed one per
``POST /v1/chat/completions`` in order, or a callable ``script(request_body) -> reply``.

A reply is a mapping with these keys (all optional, but a reply needs text,
tool calls or an error):

``text``
    Assistant message content.
``tool_calls``
    List of ``{"id": ..., "name": ..., "arguments": ...}``; ``arguments`` is a JSON
    string (a dict is JSON-encoded for you); ``id`` defaults to ``call_<n>``.
``finish_reason``
    Overrides the computed one (``"tool_calls"`` when there are tool calls, else ``"stop"``).
``usage``
    Overrides (part of) the computed ``{"prompt_tokens", "completion_tokens"}``.
``delay``
    Seconds to sleep before answering (a provider that hangs: to exercise client timeouts and
    cancellation).
``chunk_delay``
    Streaming only: seconds to sleep between SSE frames.
``abort_after``
    Streaming only: drop the connection after this many SSE frames, without the
    final frame or ``[DONE]`` (a connection reset mid-stream). Billed: the provider generated
    the answer.
``error`` / ``status``
    Answer with an OpenAI-style JSON error instead: ``{"error": "boom", "status": 429}``
    (401 for a bad key, 5xx for an outage). An error is not billed.
    Note the ``openai`` SDK retries 408/409/429/5xx by itself unless ``max_retries=0``.
``retry_after``
    With ``error``: the ``Retry-After`` header to send (e.g. ``"2"``).

A bare string is shorthand for ``{"text": that_string}``.

Streaming (``"stream": true`` in the request) answers ``text/event-stream`` with
``chat.completion.chunk`` frames the way OpenAI does: a role frame, content split
into several deltas, each tool call opened by a frame carrying index/id/type/name
with empty arguments and then continued by small ``function.arguments`` fragments
(so a client sees partial JSON), a frame with ``finish_reason``, a usage-only frame
(``choices: []``) when ``stream_options.include_usage`` was requested, then
``data: [DONE]``.

Problems with the script itself (exhausted, malformed reply, callable raised) are
answered with HTTP 400 -- which the ``openai`` SDK does not retry -- and recorded
in ``ProviderEmulator.errors`` so a test can assert on them.

``python -m threads_celery.provider_emulator --port 8199`` serves one that answers every request
with a short text, for trying an agent on a model string without a key.
"""

from __future__ import annotations

import argparse
import json
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Self
from urllib.parse import urlsplit

from threads_celery.provider_replies import (
    BilledRequest,
    NormalizedReply,
    Reply,
    Script,
    ScriptError,
    split_fragments,
)

__all__ = ["BilledRequest", "ProviderEmulator", "Reply", "Script", "split_fragments"]


class ProviderEmulator:
    """Context manager running the emulator on ``127.0.0.1:<port>`` (a free one by default).

    Attributes available while running:

    * ``base_url`` -- ``http://127.0.0.1:PORT/v1``; pass as the client's ``base_url``.
    * ``requests`` -- JSON bodies of every ``POST /v1/chat/completions`` received, in order.
    * ``billed`` -- the ledger: a :class:`BilledRequest` for every request answered, in order.
    * ``errors`` -- messages for script problems (exhausted script, bad reply, ...).
    * ``remaining`` -- scripted replies not yet consumed (``None`` for a callable script).

    ``on_billed`` is called (on the server's thread) with each ledger entry as soon as its answer
    is out: a test can kill the worker that asked right there, after the provider answered and
    before the worker commits.
    """

    def __init__(
        self,
        script: Script,
        *,
        model: str = "gpt-fake",
        text_chunk_size: int = 4,
        arguments_chunk_size: int = 4,
        port: int = 0,
        on_billed: Callable[[BilledRequest], None] | None = None,
    ) -> None:
        if callable(script):
            self._script_fn: Callable[[dict[str, Any]], Reply] | None = script
            self._script: list[Reply] = []
        else:
            self._script_fn = None
            self._script = list(script)
        self.model = model
        self.text_chunk_size = text_chunk_size
        self.arguments_chunk_size = arguments_chunk_size
        self.requests: list[dict[str, Any]] = []
        self.billed: list[BilledRequest] = []
        self.errors: list[str] = []
        self.on_billed = on_billed
        self._port = port
        self._lock = threading.Lock()
        self._next_reply = 0
        self._completion_ids = iter(range(1, 1 << 62))
        self._call_ids = iter(range(1, 1 << 62))
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle ---------------------------------------------------------

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def start(self) -> None:
        if self._server is not None:
            raise RuntimeError("the provider emulator is already running")
        server = ThreadingHTTPServer(("127.0.0.1", self._port), _make_handler(self))
        server.daemon_threads = True
        self._server = server
        self._thread = threading.Thread(
            target=server.serve_forever, kwargs={"poll_interval": 0.05}, name="provider-emulator", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        server, thread = self._server, self._thread
        self._server = self._thread = None
        if server is not None:
            server.shutdown()
            server.server_close()
        if thread is not None:
            thread.join(timeout=5)

    # -- public properties -------------------------------------------------

    @property
    def port(self) -> int:
        if self._server is None:
            raise RuntimeError("the provider emulator is not running")
        return int(self._server.server_address[1])

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def remaining(self) -> int | None:
        if self._script_fn is not None:
            return None
        with self._lock:
            return len(self._script) - self._next_reply

    # -- reply production (called from handler threads) -------------------

    def _take_reply(self, body: dict[str, Any]) -> NormalizedReply:
        with self._lock:
            self.requests.append(body)
            if self._script_fn is None:
                if self._next_reply >= len(self._script):
                    raise ScriptError(
                        f"the provider emulator script exhausted: request #{len(self.requests)} but only "
                        f"{len(self._script)} scripted repl{'y' if len(self._script) == 1 else 'ies'}"
                    )
                raw = self._script[self._next_reply]
                self._next_reply += 1
        if self._script_fn is not None:
            try:
                raw = self._script_fn(body)
            except Exception as exc:  # surfaced to the client and to .errors
                raise ScriptError(f"script callable raised {type(exc).__name__}: {exc}") from exc
        with self._lock:
            return NormalizedReply(raw, self._call_ids)

    def _new_completion_id(self) -> str:
        with self._lock:
            return f"chatcmpl-fake{next(self._completion_ids):06d}"

    @property
    def billed_usage(self) -> dict[str, int]:
        """What the ledger adds up to: ``requests``, ``input_tokens`` and ``output_tokens``."""
        with self._lock:
            billed = list(self.billed)
        return {
            "requests": len(billed),
            "input_tokens": sum(b.prompt_tokens for b in billed),
            "output_tokens": sum(b.completion_tokens for b in billed),
        }

    def _bill(self, body: Mapping[str, Any], usage: Mapping[str, int], *, delivered: bool) -> None:
        with self._lock:
            entry = BilledRequest(
                number=len(self.billed) + 1,
                model=str(body.get("model") or self.model),
                prompt_tokens=int(usage["prompt_tokens"]),
                completion_tokens=int(usage["completion_tokens"]),
                stream=bool(body.get("stream")),
                delivered=delivered,
            )
            self.billed.append(entry)
        if self.on_billed is not None:
            try:
                self.on_billed(entry)
            except Exception as exc:  # noqa: BLE001 - a test's hook: surfaced through .errors
                self._record_error(f"on_billed raised {type(exc).__name__}: {exc}")

    def _record_error(self, message: str) -> None:
        with self._lock:
            self.errors.append(message)

    def completion_body(self, reply: NormalizedReply, body: Mapping[str, Any]) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": reply.text, "refusal": None}
        if reply.tool_calls:
            message["tool_calls"] = [
                {"id": c["id"], "type": "function", "function": {"name": c["name"], "arguments": c["arguments"]}}
                for c in reply.tool_calls
            ]
        return {
            "id": self._new_completion_id(),
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body.get("model") or self.model,
            "system_fingerprint": "fp_fake",
            "choices": [{"index": 0, "message": message, "logprobs": None, "finish_reason": reply.finish_reason}],
            "usage": reply.usage(body),
        }

    def stream_frames(self, reply: NormalizedReply, body: Mapping[str, Any]) -> list[dict[str, Any]]:
        """The ``chat.completion.chunk`` objects for ``reply``, in order (without ``[DONE]``)."""
        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        completion_id = self._new_completion_id()
        created = int(time.time())
        model = body.get("model") or self.model

        def frame(delta: dict[str, Any] | None, finish_reason: str | None = None) -> dict[str, Any]:
            chunk: dict[str, Any] = {
                "id": completion_id,
                "object": "chat.completion.chunk",
                "created": created,
                "model": model,
                "system_fingerprint": "fp_fake",
                "choices": [{"index": 0, "delta": delta or {}, "logprobs": None, "finish_reason": finish_reason}],
            }
            if include_usage:
                chunk["usage"] = None
            return chunk

        frames = [frame({"role": "assistant", "content": "" if reply.text is not None else None, "refusal": None})]
        for piece in split_fragments(reply.text or "", self.text_chunk_size):
            frames.append(frame({"content": piece}))
        for index, call in enumerate(reply.tool_calls):
            frames.append(
                frame(
                    {
                        "tool_calls": [
                            {
                                "index": index,
                                "id": call["id"],
                                "type": "function",
                                "function": {"name": call["name"], "arguments": ""},
                            }
                        ]
                    }
                )
            )
            for piece in split_fragments(call["arguments"], self.arguments_chunk_size):
                frames.append(frame({"tool_calls": [{"index": index, "function": {"arguments": piece}}]}))
        frames.append(frame({}, reply.finish_reason))
        if include_usage:
            frames.append(
                {
                    "id": completion_id,
                    "object": "chat.completion.chunk",
                    "created": created,
                    "model": model,
                    "system_fingerprint": "fp_fake",
                    "choices": [],
                    "usage": reply.usage(body),
                }
            )
        return frames


def _error_body(message: str, error_type: str, code: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": error_type, "param": None, "code": code}}


def _make_handler(fake: ProviderEmulator) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        server_version = "threads-celery-provider-emulator/1.0"
        timeout = 30  # idle keep-alive connections give up eventually

        def log_message(self, format: str, *args: Any) -> None:
            pass  # keep test output clean

        # -- helpers -------------------------------------------------------

        def _path(self) -> str:
            return urlsplit(self.path).path.rstrip("/") or "/"

        def _send_json(self, status: int, payload: Mapping[str, Any], headers: Mapping[str, str] | None = None) -> None:
            data = json.dumps(payload).encode()
            self.send_response(status)
            for name, value in (headers or {}).items():
                self.send_header(name, value)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
            self.wfile.flush()

        def _write_chunk(self, data: bytes) -> None:
            self.wfile.write(f"{len(data):X}\r\n".encode() + data + b"\r\n")
            self.wfile.flush()

        def _read_json(self) -> dict[str, Any] | None:
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            try:
                body = json.loads(raw or b"null")
            except ValueError:
                body = None
            if not isinstance(body, dict):
                self._send_json(
                    HTTPStatus.BAD_REQUEST, _error_body("request body must be a JSON object", "invalid_request_error")
                )
                return None
            return body

        # -- routes --------------------------------------------------------

        def do_GET(self) -> None:
            if self._path() == "/v1/models":
                self._send_json(
                    HTTPStatus.OK,
                    {
                        "object": "list",
                        "data": [{"id": fake.model, "object": "model", "created": 0, "owned_by": "fake-openai"}],
                    },
                )
            else:
                self._not_found()

        def do_POST(self) -> None:
            if self._path() != "/v1/chat/completions":
                # Drain the body so the keep-alive connection stays usable.
                length = int(self.headers.get("Content-Length") or 0)
                if length:
                    self.rfile.read(length)
                self._not_found()
                return
            body = self._read_json()
            if body is None:
                return
            try:
                reply = fake._take_reply(body)
            except ScriptError as exc:
                fake._record_error(str(exc))
                self._send_json(HTTPStatus.BAD_REQUEST, _error_body(str(exc), "fake_script_error"))
                return

            if reply.delay:
                time.sleep(reply.delay)
            if reply.error is not None:
                self._send_json(
                    reply.status,
                    _error_body(reply.error, "server_error" if reply.status >= 500 else "api_error"),
                    {"Retry-After": reply.retry_after} if reply.retry_after is not None else None,
                )
                return
            if body.get("stream"):
                self._stream(reply, body)
            else:
                completion = fake.completion_body(reply, body)
                try:
                    self._send_json(HTTPStatus.OK, completion)
                except OSError:  # the client went away: the answer was made, and is billed
                    fake._bill(body, completion["usage"], delivered=False)
                    raise
                fake._bill(body, completion["usage"], delivered=True)

        def _stream(self, reply: NormalizedReply, body: dict[str, Any]) -> None:
            self.send_response(HTTPStatus.OK)
            self.send_header("Content-Type", "text/event-stream; charset=utf-8")
            self.send_header("Cache-Control", "no-cache")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            frames = fake.stream_frames(reply, body)
            usage = reply.usage(body)
            try:
                for sent, chunk in enumerate(frames):
                    if reply.abort_after is not None and sent >= reply.abort_after:
                        # A connection reset mid-stream: no terminating chunk, no [DONE].
                        self.close_connection = True
                        self.wfile.flush()
                        fake._bill(body, usage, delivered=False)
                        return
                    if sent and reply.chunk_delay:
                        time.sleep(reply.chunk_delay)
                    self._write_chunk(f"data: {json.dumps(chunk)}\n\n".encode())
                self._write_chunk(b"data: [DONE]\n\n")
                self.wfile.write(b"0\r\n\r\n")
                self.wfile.flush()
            except OSError:  # the client went away mid-stream: what was generated is billed
                fake._bill(body, usage, delivered=False)
                raise
            fake._bill(body, usage, delivered=True)

        def _not_found(self) -> None:
            self._send_json(
                HTTPStatus.NOT_FOUND,
                _error_body(f"Unknown request URL: {self.command} {self.path}", "invalid_request_error", "unknown_url"),
            )

    return Handler


def main(argv: Sequence[str] | None = None) -> None:
    """Serve an emulator that answers every request with ``--reply`` until interrupted."""
    parser = argparse.ArgumentParser(
        prog="python -m threads_celery.provider_emulator",
        description="An OpenAI-compatible server on loopback that answers with a fixed text and bills it.",
    )
    parser.add_argument("--port", type=int, default=8199)
    parser.add_argument("--reply", default="Hello from the provider emulator.")
    args = parser.parse_args(argv)
    reply: str = args.reply
    with ProviderEmulator(lambda body: reply, port=args.port) as provider:
        print(f"OPENAI_BASE_URL={provider.base_url}  (any OPENAI_API_KEY); Ctrl-C to stop", flush=True)
        try:
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            pass
        print(f"billed {provider.billed_usage}", flush=True)


if __name__ == "__main__":
    main()
