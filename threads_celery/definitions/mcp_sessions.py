"""Live MCP sessions, kept per process: one connection (or one running stdio server) per server.

Starting a stdio server and shaking hands costs half a second or more; a connection over HTTP
costs a handshake too. So each process keeps one session per :class:`MCPServer` and sends every
call of that server through it. The sessions live on an event loop of their own, in a thread of
this module: a session's tasks must stay on the loop that opened it, while tool calls come from
whatever loop or thread the worker runs them on.

A session is checked before it is used: one whose connection ended (a stdio server that exited)
is replaced, and one idle for :data:`CHECK_AFTER_IDLE_S` is pinged first. What happens to a call
in flight when its session dies is decided by the call's effect, as for any call
(:meth:`MCPServer.call`). After a fork (a prefork pool process), the child starts sessions of
its own: a session is never shared between processes.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import contextlib
import math
import os
import threading
import time
from collections.abc import AsyncIterator, Callable, Coroutine
from contextlib import AbstractAsyncContextManager
from typing import TYPE_CHECKING, Any, TypeVar

import anyio

if TYPE_CHECKING:
    from mcp import Client

_T = TypeVar("_T")

#: A session that has not been used for this long is pinged before a call is sent through it.
CHECK_AFTER_IDLE_S = 30.0


class SessionGone(Exception):
    """The session ended before the call could be sent on it."""


class Session:
    """One open client of one server, held by a task on the sessions' loop."""

    def __init__(self) -> None:
        self.client: Client | None = None
        self.used_at = time.monotonic()
        #: Calls sent on this session and not answered yet.
        self.in_flight = 0
        #: No new call is sent on it: it is closed once its calls in flight have ended.
        self.retired = False
        self.connected = asyncio.Event()
        self._stop = asyncio.Event()
        self._ended = asyncio.Event()

    @property
    def alive(self) -> bool:
        """Whether the connection is still open: its holding task has not ended, and the SDK has
        not seen it close (a stdio server that exited while the session was idle)."""
        return self.client is not None and not self._ended.is_set() and not _seen_closed(self.client)

    @contextlib.asynccontextmanager
    async def sending(self) -> AsyncIterator[Client]:
        """Send one call on this session; a session retired meanwhile closes after its last call."""
        assert self.client is not None
        self.in_flight += 1
        self.used_at = time.monotonic()
        try:
            yield self.client
        finally:
            self.in_flight -= 1
            self.used_at = time.monotonic()
            if self.retired and self.in_flight == 0:
                with anyio.move_on_after(5.0, shield=True):
                    await self.close()

    async def hold(self, connect: Callable[[], AbstractAsyncContextManager[Client]], timeout_s: float) -> None:
        """Open the client within ``timeout_s`` and keep it open until :meth:`close`."""
        try:
            with anyio.CancelScope() as scope:
                scope.deadline = anyio.current_time() + timeout_s
                async with connect() as client:
                    scope.deadline = math.inf  # connected: the session lives on
                    self.client = client
                    self.connected.set()
                    await self._stop.wait()
            if scope.cancelled_caught and self.client is None:
                raise TimeoutError(f"did not connect within {timeout_s:g} s")
        finally:
            self._ended.set()

    async def close(self) -> None:
        """Close the client and wait until it is closed."""
        self._stop.set()
        await self._ended.wait()


def _seen_closed(client: Client) -> bool:
    """Whether the SDK has marked the connection closed (its reader saw the end of the stream).

    The SDK then refuses to send, with the same error as a connection that closed during a call;
    asking first tells "never sent" from "sent, no answer". Read defensively: an SDK without this
    state is taken as open, and a dead server is then found by the idle ping or the call itself.
    """
    try:
        dispatcher = getattr(client.session, "_dispatcher", None)
    except Exception:  # noqa: BLE001 - a client without a session is not usable either
        return True
    return getattr(dispatcher, "_closed", False) is True


class SessionPool:
    """The process's sessions, by server, on an event loop thread of their own."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pid = os.getpid()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._sessions: dict[int, Session] = {}
        self._opening: dict[int, asyncio.Future[Session]] = {}
        self._tasks: set[asyncio.Future[None]] = set()  # the openings under way (kept referenced)

    def _running_loop(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._pid != os.getpid():  # forked: the parent's loop thread is not here
                self._pid, self._loop = os.getpid(), None
                self._sessions.clear()
                self._opening.clear()
            if self._loop is None or self._loop.is_closed():
                loop = asyncio.new_event_loop()
                thread = threading.Thread(target=loop.run_forever, name="threads-mcp-sessions", daemon=True)
                thread.start()
                self._loop = loop
                atexit.register(self.close_all)
            return self._loop

    def submit(self, coroutine: Coroutine[Any, Any, _T]) -> concurrent.futures.Future[_T]:
        """Run ``coroutine`` on the sessions' loop."""
        return asyncio.run_coroutine_threadsafe(coroutine, self._running_loop())

    async def run(self, coroutine: Coroutine[Any, Any, _T]) -> _T:
        """Await ``coroutine`` run on the sessions' loop, from any other loop."""
        return await asyncio.wrap_future(self.submit(coroutine))

    async def session(
        self,
        key: int,
        connect: Callable[[], AbstractAsyncContextManager[Client]],
        timeout_s: float,
        ping: Callable[[Client], Coroutine[Any, Any, Any]],
    ) -> Session:
        """The live session for ``key``, opened (or opened again) within ``timeout_s``.

        Runs on the sessions' loop. Raises what opening the session raised.
        """
        current = self._sessions.get(key)
        idle = current is not None and current.in_flight == 0
        if current is not None and current.alive and idle and time.monotonic() - current.used_at > CHECK_AFTER_IDLE_S:
            assert current.client is not None
            try:
                with anyio.fail_after(timeout_s):
                    await ping(current.client)
                current.used_at = time.monotonic()
            except Exception:  # noqa: BLE001 - a session that does not answer a ping is replaced
                await self.discard(key)
                current = None
        if current is not None and current.alive:
            return current
        if current is not None:
            await self.discard(key)
        opening = self._opening.get(key)
        if opening is None:  # one opening per server, whoever asks meanwhile waits for it
            opening = asyncio.get_running_loop().create_future()
            self._opening[key] = opening
            task = asyncio.ensure_future(self._open(key, connect, timeout_s, opening))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        return await asyncio.shield(opening)

    async def _open(
        self,
        key: int,
        connect: Callable[[], AbstractAsyncContextManager[Client]],
        timeout_s: float,
        opening: asyncio.Future[Session],
    ) -> None:
        session = Session()
        holder = asyncio.ensure_future(session.hold(connect, timeout_s))
        connected = asyncio.ensure_future(session.connected.wait())
        try:
            await asyncio.wait([holder, connected], return_when=asyncio.FIRST_COMPLETED)
            connected.cancel()
            if session.client is None:
                holder.result()  # raises why it could not connect
                raise SessionGone("the session closed as it opened")
            self._sessions[key] = session
            opening.set_result(session)
        except BaseException as exc:  # noqa: BLE001 - handed to every caller waiting for it
            opening.set_exception(exc)
            opening.exception()  # retrieved: a caller that gave up must not leave it unread
        finally:
            self._opening.pop(key, None)

    def retire(self, key: int, session: Session) -> None:
        """Send no new call on ``session``: the next call of ``key`` opens a new one. It closes
        once its calls in flight have ended (a call that failed on it may have left it unusable,
        say a server hung in a tool; the other calls on it are left to end by themselves)."""
        session.retired = True
        if self._sessions.get(key) is session:
            del self._sessions[key]

    async def discard(self, key: int) -> None:
        """Close and forget the session of ``key``."""
        session = self._sessions.pop(key, None)
        if session is not None:
            try:
                with anyio.move_on_after(5.0):
                    await session.close()
            except Exception:  # noqa: BLE001 - a session that fails to close is gone all the same
                pass

    def forget(self, key: int) -> None:
        """Close the session of ``key`` in the background (its server object is gone)."""
        if self._loop is not None and self._pid == os.getpid() and key in self._sessions and not self._loop.is_closed():
            with contextlib.suppress(RuntimeError):  # the loop stopped meanwhile (at exit)
                self.submit(self.discard(key))

    def close_all(self, timeout_s: float = 5.0) -> None:
        """Close every session of this process (its stdio servers stop)."""
        if self._loop is None or self._pid != os.getpid():
            return

        async def close() -> None:
            for key in list(self._sessions):
                await self.discard(key)

        with contextlib.suppress(Exception):  # at exit: what does not close in time is left to the OS
            self.submit(close()).result(timeout_s)


#: The sessions of this process.
POOL = SessionPool()


__all__ = ["CHECK_AFTER_IDLE_S", "POOL", "Session", "SessionGone", "SessionPool"]
