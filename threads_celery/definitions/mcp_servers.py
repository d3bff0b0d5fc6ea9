"""MCP servers as tool sources: ``Agent(..., mcp_servers=[MCPServer(...)])``.

Each tool an MCP server lists becomes a durable tool of the agent: its calls get an effect key,
a permission check and a ``threads.tool`` task like any other tool. What a crash means comes from
the tool's annotations: ``readOnlyHint`` makes it read_only, ``idempotentHint`` idempotent (with
the dedup window the author sets), anything else unguarded, which asks a person first under the
default permission mode. The author can state any tool's effect instead (``effects={...}``):
annotations are the server's own claim, so trust them only as far as you trust the server.

The tool list is read once per process, when the agent is built, and becomes part of the agent's
configuration fingerprint: a server whose tool list (names, schemas, descriptions or effects)
changed under a live thread is a configuration change like any other.

Each process keeps one session per server (a running stdio server, or a connection over HTTP;
:mod:`threads_celery.definitions.mcp_sessions`), checked before use and started again when it
died. ``connect_timeout_s`` bounds everything before a call is sent (starting or reaching the
server, the SDK's protocol probe and handshake), ``timeout_s`` the call. A call that fails before
anything was sent is a tool error, and so is a JSON-RPC error answer (the server refused the
request); a server that dies, hangs or answers garbage once the call was sent leaves it unknown
whether the tool acted: a read_only call ends as a tool error the model sees, any other call parks
for a person (:class:`~threads_celery.exceptions.EffectUnknown`). ``destructiveHint`` (true unless
the server says false, as MCP defines it) makes a tool ask first under ``accept_edits``.

The ``mcp`` package (the official MCP Python SDK) is needed only by agents that use MCP servers:
``pip install 'threads-celery[mcp]'``.
"""

from __future__ import annotations

import itertools
import json
import re
import threading
import weakref
from collections.abc import Awaitable, Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import urlsplit

import anyio
from pydantic import ValidationError

from threads_celery.decisions.effects import Reconcile
from threads_celery.definitions.mcp_content import call_result_content, render_call_result
from threads_celery.definitions.mcp_schemas import json_schema_validator, object_schema
from threads_celery.definitions.mcp_sessions import POOL
from threads_celery.definitions.schema_tools import EffectChoice, SchemaTool, ToolArguments, schema_tool, stated_effect
from threads_celery.definitions.tools import RESERVED_TOOL_NAMES
from threads_celery.exceptions import ConfigError, EffectUnknown

if TYPE_CHECKING:
    from mcp import Client

#: What model providers accept as a tool name.
MODEL_TOOL_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
DEFAULT_TIMEOUT_S = 60.0
DEFAULT_CONNECT_TIMEOUT_S = 30.0
#: JSON-RPC error codes the SDK raises itself when no answer came: the connection closed
#: (-32000) or the read timed out (-32001). Any other code is the server's answer.
_NO_ANSWER = (-32000, -32001)
_SESSION_KEYS = itertools.count()

_T = TypeVar("_T")


class MCPToolFailed(Exception):
    """The MCP server answered the call with an error result (``isError``)."""


class MCPUnreachable(Exception):
    """The call never reached the MCP server (it could not be started or connected to)."""


@dataclass(frozen=True, slots=True)
class Hints:
    """The annotations of an MCP tool that bear on its effect (None: the server did not say)."""

    read_only: bool | None = None
    idempotent: bool | None = None
    destructive: bool | None = None

    @property
    def may_destroy(self) -> bool:
        """Whether the tool may destroy or overwrite: ``destructiveHint``, true unless the server
        says false (the MCP default), and never for a read-only tool."""
        return not self.read_only and self.destructive is not False


def effect_from_hints(hints: Hints) -> str:
    """The effect an MCP tool's annotations stand for. Pure.

    ``readOnlyHint`` wins over ``idempotentHint``; a tool that claims neither is unguarded (the
    MCP defaults for both hints are false).
    """
    if hints.read_only:
        return "read_only"
    if hints.idempotent:
        return "idempotent"
    return "unguarded"


def decide_tool_effect(
    server: str,
    tool_name: str,
    hints: Hints,
    override: EffectChoice | None,
    dedup_window_ms: int | Mapping[str, int] | None,
) -> tuple[str, int | None, Reconcile | None]:
    """(effect, dedup window, reconcile) for one MCP tool: the author's word, else its annotations.

    Pure. An idempotent tool (by annotation or by the author's word) with no dedup window is a
    ConfigError: how long a repeated call stays harmless is the author's call, never a guess.
    """
    choice: EffectChoice = override if override is not None else effect_from_hints(hints)
    return stated_effect(f"MCP server {server!r}", tool_name, choice, dedup_window_ms)


class MCPServer:
    """An MCP server whose tools an agent can call, over stdio or streamable HTTP.

    Give ``command`` (and ``args``, ``env``, ``cwd``) to start a stdio server, or ``url`` (and
    ``headers``) for a streamable HTTP one. ``effects`` maps the server's tool names to the
    effect the author states for them (an effect name, or a
    :class:`~threads_celery.decisions.effects.Reconcile` for a reconcilable tool), overriding the
    annotations. ``dedup_window_ms`` (one number, or a mapping by tool name) is the window of the
    server's idempotent tools. ``timeout_s`` bounds each call once connected;
    ``connect_timeout_s`` bounds starting or reaching the server (and listing its tools). ``prefix``
    names the tools ``<prefix>_<tool>`` (to keep two servers' tools apart); ``include`` takes only
    the tools it names; ``queue`` routes their calls to a Celery queue.

    Raises ConfigError for a server given both or neither of ``command`` and ``url``, bad
    options, or (when the tools are listed) a server that cannot be reached, an effect for a
    tool the server does not list, or an idempotent tool without a window.
    """

    def __init__(
        self,
        name: str | None = None,
        *,
        command: str | None = None,
        args: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        url: str | None = None,
        headers: Mapping[str, str] | None = None,
        effects: Mapping[str, EffectChoice] | None = None,
        dedup_window_ms: int | Mapping[str, int] | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S,
        prefix: str | None = None,
        queue: str | None = None,
        include: Sequence[str] | None = None,
    ) -> None:
        if (command is None) == (url is None):
            raise ConfigError("MCPServer needs exactly one of command= (stdio) or url= (streamable HTTP)")
        if isinstance(args, str):
            raise ConfigError("MCPServer args must be a list of strings, not one string")
        if url is not None and not url.startswith(("http://", "https://")):
            raise ConfigError(f"MCPServer url must start with http:// or https://, not {url!r}")
        for option, value in (("timeout_s", timeout_s), ("connect_timeout_s", connect_timeout_s)):
            if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
                raise ConfigError(f"MCPServer {option} must be a positive number of seconds, not {value!r}")
        if prefix is not None and not MODEL_TOOL_NAME.match(prefix):
            raise ConfigError(f"MCPServer prefix {prefix!r} must be letters, digits, '_' or '-'")
        self.name = name or (_shown_url(url) if url is not None else " ".join([str(command), *args]))
        self.command = command
        self.args = tuple(args)
        self.env = dict(env) if env is not None else None
        self.cwd = cwd
        self.url = url
        self._headers = dict(headers) if headers is not None else None  # may hold a token: never shown
        self.effects = dict(effects or {})
        self.dedup_window_ms = dedup_window_ms
        self.timeout_s = float(timeout_s)
        self.connect_timeout_s = float(connect_timeout_s)
        self.prefix = prefix
        self.queue = queue
        if isinstance(include, str):
            raise ConfigError("MCPServer include must be a list of tool names, not one string")
        self.include = tuple(include) if include is not None else None
        self._tools: tuple[SchemaTool, ...] | None = None
        self._lock = threading.Lock()
        #: This server's session in the process's pool (an id() could be reused once it is gone).
        self._session_key = next(_SESSION_KEYS)
        weakref.finalize(self, POOL.forget, self._session_key)

    def __repr__(self) -> str:
        return f"<MCPServer {self.name!r}>"

    # -- the tool list ----------------------------------------------------------------------

    def tools(self) -> tuple[SchemaTool, ...]:
        """This server's tools as durable tools, listed once per process (then pinned)."""
        with self._lock:
            if self._tools is None:
                self._tools = self._build_tools()
            return self._tools

    def _build_tools(self) -> tuple[SchemaTool, ...]:
        try:
            listed = run_in_fresh_loop(self._list_tools, self.connect_timeout_s)
        except Exception as exc:  # noqa: BLE001 - any failure to list is the same ConfigError
            raise ConfigError(
                f"cannot list the tools of MCP server {self.name!r}: {describe_failure(exc, self.connect_timeout_s)}"
            ) from None
        by_name = {t.name: t for t in listed}
        unknown = sorted((set(self.effects) | set(self.include or ())) - set(by_name))
        if unknown:
            raise ConfigError(
                f"MCP server {self.name!r} lists no tool named {', '.join(map(repr, unknown))} "
                f"(it lists: {', '.join(sorted(by_name)) or 'none'}); fix effects= or include="
            )
        built: list[SchemaTool] = []
        missing_windows: list[str] = []
        for remote in listed:
            if self.include is not None and remote.name not in self.include:
                continue
            annotations = remote.annotations
            hints = Hints(
                read_only=annotations.read_only_hint if annotations else None,
                idempotent=annotations.idempotent_hint if annotations else None,
                destructive=annotations.destructive_hint if annotations else None,
            )
            try:
                effect, window, reconcile = decide_tool_effect(
                    self.name,
                    remote.name,
                    hints,
                    self.effects.get(remote.name),
                    self.dedup_window_ms,
                )
            except ConfigError:
                if effect_from_hints(hints) == "idempotent" and remote.name not in self.effects:
                    missing_windows.append(remote.name)
                    continue
                raise
            built.append(
                self._tool(
                    remote.name,
                    remote.description or "",
                    remote.input_schema,
                    effect,
                    window,
                    reconcile,
                    destructive=hints.may_destroy,
                )
            )
        if missing_windows:
            raise ConfigError(
                f"MCP server {self.name!r} marks {', '.join(map(repr, missing_windows))} idempotent "
                "(idempotentHint), but no dedup_window_ms says for how long a repeated call is harmless: "
                "set MCPServer(..., dedup_window_ms=...) (milliseconds, or a mapping by tool name), or "
                "state the effect with effects={...}"
            )
        return tuple(built)

    def _tool(
        self,
        remote_name: str,
        description: str,
        input_schema: Mapping[str, Any],
        effect: str,
        window: int | None,
        reconcile: Reconcile | None,
        *,
        destructive: bool = False,
    ) -> SchemaTool:
        local_name = f"{self.prefix}_{remote_name}" if self.prefix else remote_name
        if not MODEL_TOOL_NAME.match(local_name) or local_name in RESERVED_TOOL_NAMES:
            raise ConfigError(
                f"MCP server {self.name!r}: tool name {local_name!r} cannot be given to a model "
                "(use letters, digits, '_' or '-', at most 64 characters; not a reserved name); "
                "set prefix=, or leave the tool out with include=[...]"
            )
        schema = object_schema(dict(input_schema))
        validate = json_schema_validator(self.name, remote_name, schema)

        async def execute(arguments: ToolArguments, ctx: Any) -> str:
            return await self.call(remote_name, arguments.values, effect_key=getattr(ctx, "effect_key", None))

        return schema_tool(
            name=local_name,
            description=description,
            json_schema=schema,
            validate=validate,
            execute=execute,
            effect=effect,
            dedup_window_ms=window,
            reconcile=reconcile,
            queue=self.queue,
            destructive=destructive,
        )

    # -- calls ------------------------------------------------------------------------------

    def _client(self) -> AbstractAsyncContextManager[Client]:
        from mcp import Client, StdioServerParameters  # the optional mcp extra (threads-celery[mcp])

        if self.command is not None:
            params = StdioServerParameters(command=self.command, args=list(self.args), env=self.env, cwd=self.cwd)
            return Client(params, read_timeout_seconds=self.connect_timeout_s)
        assert self.url is not None
        if not self._headers:
            return Client(self.url, read_timeout_seconds=self.connect_timeout_s)
        return _http_client_with_headers(self.url, self._headers, self.connect_timeout_s)

    async def _list_tools(self) -> list[Any]:
        async with self._client() as client:
            tools: list[Any] = []
            cursor: str | None = None
            for _ in range(100):  # a server whose pages never end cannot hang the agent's build
                page = await client.list_tools(cursor=cursor)
                tools.extend(page.tools)
                cursor = page.next_cursor
                if cursor is None:
                    return tools
            raise ConfigError("the server's tool list did not end after 100 pages")

    async def call(self, remote_name: str, arguments: dict[str, Any], *, effect_key: str | None = None) -> str:
        """Call one tool on the server, through this process's session with it, and return what
        the model sees.

        Raises :class:`MCPUnreachable` when nothing was sent (the server could not be started
        or reached within ``connect_timeout_s``), :class:`MCPToolFailed` for an error result or
        a JSON-RPC error answer (the server refused the request), and
        :class:`~threads_celery.exceptions.EffectUnknown` when the server failed after the call
        was sent (it died, hung past ``timeout_s`` or answered garbage).
        """
        return await POOL.run(self._call_on_session(remote_name, arguments, effect_key))

    async def _call_on_session(self, remote_name: str, arguments: dict[str, Any], effect_key: str | None) -> str:
        from mcp.shared.exceptions import MCPError  # the optional mcp extra (threads-celery[mcp])

        key = self._session_key
        try:
            session = await POOL.session(key, self._client, self.connect_timeout_s, _ping)
        except Exception as exc:  # noqa: BLE001 - nothing was sent: the call never reached the server
            why = describe_failure(exc, self.connect_timeout_s)
            raise MCPUnreachable(f"MCP server {self.name!r} could not be reached: {why}") from None
        meta: Any = {"io.threads-celery/effect-key": effect_key} if effect_key else None
        async with session.sending() as client:
            try:
                # A backstop: the call is bounded by its own read timeout.
                with anyio.fail_after(self.timeout_s + 5.0):
                    result = await client.call_tool(
                        remote_name, arguments, read_timeout_seconds=self.timeout_s, meta=meta
                    )
            except Exception as exc:  # noqa: BLE001 - classified below
                if isinstance(exc, MCPError) and exc.code not in _NO_ANSWER:
                    # An answer: the server refused the request, and the session is fine.
                    raise MCPToolFailed(
                        f"the MCP server refused the call of {remote_name!r}: {exc.message} (JSON-RPC error {exc.code})"
                    ) from None
                POOL.retire(key, session)  # whatever state it is in, the next call starts afresh
                why = describe_failure(exc, self.timeout_s)
                raise EffectUnknown(
                    f"MCP server {self.name!r} {why} during a call of {remote_name!r}, so whether the tool "
                    "acted is unknown"
                ) from None
        if result.is_error:
            raise MCPToolFailed(render_call_result(result) or f"{remote_name} failed on the MCP server")
        return call_result_content(result)


async def _ping(client: Client) -> None:
    await client.send_ping()


def _shown_url(url: str) -> str:
    """A URL fit for messages: no credentials, no query (either may hold a token)."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    port = f":{parts.port}" if parts.port else ""
    return f"{parts.scheme}://{host}{port}{parts.path}"


def describe_failure(exc: BaseException, timeout_s: float) -> str:
    """A sentence for why talking to an MCP server failed (no traceback, no arguments)."""
    leaves = _leaf_exceptions(exc)
    if any(isinstance(e, TimeoutError) or "timed out" in str(e) for e in leaves):
        return f"did not answer within {timeout_s:g} s"
    if any(isinstance(e, ValidationError | json.JSONDecodeError) for e in leaves):
        return "answered with something that is not a valid MCP message"
    first = leaves[0] if leaves else exc
    message = str(first)
    if "Connection closed" in message:
        return "closed the connection (the server process may have died)"
    return f"failed ({type(first).__name__}: {message})" if message else f"failed ({type(first).__name__})"


def _leaf_exceptions(exc: BaseException) -> list[BaseException]:
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for inner in exc.exceptions for leaf in _leaf_exceptions(inner)]
    return [exc]


def _http_client_with_headers(
    url: str, headers: Mapping[str, str], timeout_s: float
) -> AbstractAsyncContextManager[Client]:
    # mcp is an optional extra (threads-celery[mcp]); httpx2 comes with it.
    import httpx2
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client

    @asynccontextmanager
    async def connect() -> Any:
        async with (
            httpx2.AsyncClient(headers=dict(headers), timeout=timeout_s) as http,
            Client(streamable_http_client(url, http_client=http), read_timeout_seconds=timeout_s) as client,
        ):
            yield client

    return connect()


def run_in_fresh_loop(factory: Callable[[], Awaitable[_T]], timeout_s: float) -> _T:
    """Run ``factory()`` to completion on a new event loop in a thread of its own.

    Agents are built at import time, which may be inside a running event loop (a web app);
    a thread of its own keeps that loop out of it. Bounded by ``timeout_s`` (plus a grace).
    """
    outcome: dict[str, Any] = {}

    def target() -> None:
        async def bounded() -> _T:
            with anyio.fail_after(timeout_s):
                return await factory()

        try:
            outcome["value"] = anyio.run(bounded)
        except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread
            outcome["error"] = exc

    thread = threading.Thread(target=target, name="mcp-list-tools", daemon=True)
    thread.start()
    thread.join(timeout_s + 10.0)
    if thread.is_alive():
        raise TimeoutError(f"did not finish within {timeout_s:g} s")
    if "error" in outcome:
        raise outcome["error"]
    value: _T = outcome["value"]
    return value


def mcp_tools(agent_name: str, servers: Sequence[Any]) -> tuple[SchemaTool, ...]:
    """The tools of every server of an agent, in order (ConfigError for a non-MCPServer)."""
    found: list[SchemaTool] = []
    for server in servers:
        if not isinstance(server, MCPServer):
            raise ConfigError(
                f"agent {agent_name!r}: mcp_servers must be MCPServer(...) values, not {type(server).__name__}"
            )
        found.extend(server.tools())
    return tuple(found)


__all__ = [
    "Hints",
    "MCPServer",
    "MCPToolFailed",
    "MCPUnreachable",
    "decide_tool_effect",
    "effect_from_hints",
    "mcp_tools",
]
