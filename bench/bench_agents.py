"""What the benchmark worker imports: the no-op agent, the bare Celery chain, and instruments.

Loaded by ``bench/tool_call_overhead.py``'s worker as both ``THREADS_AGENTS=bench.bench_agents``
(the agent) and ``celery -A tasks worker -I bench.bench_agents`` (the bare task and the signal
handlers), so both sides of the comparison run in the same worker processes.

* ``bench_noop``: an agent whose scripted model answers the user message ``"<tool> <n>"`` with one
  reply calling ``<tool>`` n times (``noop_ro`` is read_only, ``noop_ug`` unguarded), then ``done``.
* ``bench.noop_chain(remaining, key)``: the same no-op as a bare task that enqueues the next one,
  so the chain is sequential like the calls of one model reply.
* Instruments (only when ``BENCH_TRACE_DIR`` is set): every task writes one JSON line (task,
  run key, start/end times, the CPU time of its pool process, and the PostgreSQL round trips
  it made, by kind, and the CPU time the model layer took in it: see :func:`time_model_layer`) to
  ``$BENCH_TRACE_DIR/<pid>.jsonl``; a run's final step and a chain's last task push to the Redis
  list ``bench:done:<key>`` so the driver can wait without polling.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

from pydantic import BaseModel, ConfigDict

from threads_celery import Agent, tool
from threads_celery.decisions.permissions import Permissions
from threads_celery.testing import Reply, ScriptedModel, calls

DONE_PREFIX = "bench:done:"
CHAIN_TASK = "bench.noop_chain"
STORED_CHAIN_TASK = "bench.noop_chain_stored"


def noop() -> str:
    """The work both sides do: nothing."""
    return "ok"


class NoInput(BaseModel):
    model_config = ConfigDict(extra="forbid")


noop_ro = tool(
    name="noop_ro",
    description="Do nothing (read_only).",
    input=NoInput,
    effect="read_only",
    execute=lambda _inp, _ctx: noop(),
)
noop_ug = tool(
    name="noop_ug",
    description="Do nothing (unguarded).",
    input=NoInput,
    effect="unguarded",
    execute=lambda _inp, _ctx: noop(),
)


def _fan_out(messages: list[Any]) -> Reply:
    """One reply calling the tool named in the user message as many times as it says."""
    from pydantic_ai.messages import ModelRequest, UserPromptPart

    prompt = ""
    for message in messages:
        if isinstance(message, ModelRequest):
            for part in message.parts:
                if isinstance(part, UserPromptPart) and isinstance(part.content, str):
                    prompt = part.content
    name, _, count = prompt.partition(" ")
    if name not in ("noop_ro", "noop_ug"):
        raise ValueError(f"the bench agent expects '<noop_ro|noop_ug> <n>', got {prompt!r}")
    return calls(*[(name, {})] * int(count))


bench_noop = Agent(
    name="bench_noop",
    instructions="Call the no-op tool as asked.",
    model=ScriptedModel([_fan_out, "done"], chunk_size=64),
    tools=[noop_ro, noop_ug],
    permissions=Permissions(allow=["noop_ug"]),  # unguarded tools ask a person by default
    max_steps=5,
)


def _turns_stream(messages: list[Any], _info: Any) -> Any:
    """A model of constant cost: ``"turns <k>"`` gets k replies each calling ``noop_ro``, then ``done``.

    Reads only the first and the last two messages (the prompt, and the previous reply's call id
    ``t<i>``), so its cost does not grow with the history: what grows is ours.
    """
    from pydantic_ai.messages import ModelResponse, ToolCallPart, UserPromptPart
    from pydantic_ai.models.function import DeltaToolCall

    async def stream() -> Any:
        prompt = next(p.content for p in messages[0].parts if isinstance(p, UserPromptPart))
        total = int(str(prompt).split()[1])
        done = 0
        if len(messages) >= 2 and isinstance(messages[-2], ModelResponse):
            call = next((p for p in messages[-2].parts if isinstance(p, ToolCallPart)), None)
            done = int(call.tool_call_id[1:]) if call is not None else total
        if done >= total:
            yield "done"
        else:
            yield {0: DeltaToolCall(name="noop_ro", json_args="{}", tool_call_id=f"t{done + 1}")}

    return stream()


def _turns_model() -> Any:
    from pydantic_ai.models.function import FunctionModel

    return FunctionModel(stream_function=_turns_stream, model_name="bench-turns")


#: K turns of one no-op read_only call each (``"turns <k>"``), then a closing reply: 2K+1 tasks.
bench_turns = Agent(
    name="bench_turns",
    instructions="Call the no-op tool once per turn.",
    model=_turns_model(),
    tools=[noop_ro],
    max_steps=100_000,
)


# -- the bare side and the instruments (worker only) ------------------------------------------


class _Counters:
    """SQL activity of the current task in this process."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.statements = 0
        self.commits = 0
        self.rollbacks = 0
        self.pings = 0
        self.begins = 0
        self.log: list[str] | None = None

    def note(self, what: str) -> None:
        if self.log is not None:
            self.log.append(what)


counters = _Counters()
_trace: dict[str, Any] = {
    "pid": None,
    "file": None,
    "t0": 0.0,
    "cpu0": 0.0,
    "redis": None,
    "model_cpu": 0.0,
    "model_at": 0.0,
}


def time_model_layer(add: Any) -> None:
    """Add to ``add(seconds)`` the CPU time spent inside the model layer of every model step.

    The model layer is ``pydantic_ai.direct.model_request_stream`` and all it runs: its
    preparation of the history, the model's own request (for the function models of these
    benches, their checks of the history and the stream function) and the stream's events. Timed
    are its entry and exit, each event it yields and ``get()``; the runtime's own work between
    events (feeding the tool-call starts) and its conversion of the history before the call are
    not. Any model reads the whole history on every request (a provider's adapter serialises all
    of it), so this part grows with the thread by nature; the rest of a step is the runtime's.
    """
    import pydantic_ai.direct as direct

    original = direct.model_request_stream
    if getattr(original, "_bench_timed", False):
        return

    def timed(started: float) -> None:
        add(time.process_time() - started)

    class TimedStream:
        def __init__(self, stream: Any) -> None:
            self._stream = stream
            self._events: Any = None

        def __aiter__(self) -> TimedStream:
            started = time.process_time()
            self._events = self._stream.__aiter__()
            timed(started)
            return self

        async def __anext__(self) -> Any:
            started = time.process_time()
            try:
                return await self._events.__anext__()
            finally:
                timed(started)

        def get(self) -> Any:
            started = time.process_time()
            try:
                return self._stream.get()
            finally:
                timed(started)

        def __getattr__(self, name: str) -> Any:
            return getattr(self._stream, name)

    class TimedRequest:
        def __init__(self, context: Any) -> None:
            self._context = context

        async def __aenter__(self) -> TimedStream:
            started = time.process_time()
            try:
                return TimedStream(await self._context.__aenter__())
            finally:
                timed(started)

        async def __aexit__(self, *exc_info: object) -> Any:
            started = time.process_time()
            try:
                return await self._context.__aexit__(*exc_info)
            finally:
                timed(started)

    def model_request_stream(*args: Any, **kwargs: Any) -> TimedRequest:
        if not _trace["model_at"]:
            _trace["model_at"] = time.time()  # the task's first model call (bench/run_latency.py)
        started = time.process_time()
        try:
            return TimedRequest(original(*args, **kwargs))
        finally:
            timed(started)

    model_request_stream._bench_timed = True  # type: ignore[attr-defined]
    direct.model_request_stream = model_request_stream  # type: ignore[assignment]


def _add_model_cpu(seconds: float) -> None:
    _trace["model_cpu"] += seconds


def install_sql_counters() -> None:
    """Count the PostgreSQL round trips of every engine in this process, by kind.

    With psycopg 3 each of these is one round trip: a statement; BEGIN, sent on its own before
    a transaction's first statement; COMMIT; ROLLBACK (skipped by psycopg when no transaction
    is open, as in autocommit); and the ``SELECT 1`` of ``pool_pre_ping`` on checkout.
    """
    from sqlalchemy import event
    from sqlalchemy.dialects.postgresql._psycopg_common import _PGDialect_common_psycopg
    from sqlalchemy.engine import Engine

    def _in_transaction_mode(conn: Any) -> bool:
        try:
            return not conn.connection.dbapi_connection.autocommit
        except Exception:  # noqa: BLE001 - not psycopg (SQLite), or an invalidated connection
            return True

    def _statement(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        counters.statements += 1
        counters.note(" ".join(statement.split()))

    def _begin(conn: Any) -> None:
        if _in_transaction_mode(conn):
            counters.begins += 1
            counters.note("BEGIN")

    def _commit(conn: Any) -> None:
        if _in_transaction_mode(conn):
            counters.commits += 1
            counters.note("COMMIT")

    def _rollback(conn: Any) -> None:
        if _in_transaction_mode(conn):
            counters.rollbacks += 1
            counters.note("ROLLBACK")

    if not getattr(_PGDialect_common_psycopg.do_ping, "_bench_counted", False):
        ping = _PGDialect_common_psycopg.do_ping

        def do_ping(self: Any, dbapi_connection: Any) -> bool:
            counters.pings += 1
            counters.note("SELECT 1 (pool pre-ping)")
            return ping(self, dbapi_connection)

        do_ping._bench_counted = True  # type: ignore[attr-defined]
        _PGDialect_common_psycopg.do_ping = do_ping  # type: ignore[method-assign]
    # A tool call's own statements run on the driver's cursor (store/direct.py), unseen by
    # the engine's events: count them where they run (each one statement, in autocommit).
    from threads_celery.store.direct import DirectStatements

    if not getattr(DirectStatements._prepare, "_bench_counted", False):
        prepare = DirectStatements._prepare  # once per statement run, with the statement

        def counted_prepare(self: Any, statement: Any) -> Any:
            counters.statements += 1
            if counters.log is not None:  # compiling the statement to text costs a millisecond
                counters.note(" ".join(str(statement).split()) + " (direct)")
            return prepare(self, statement)

        counted_prepare._bench_counted = True  # type: ignore[attr-defined]
        DirectStatements._prepare = counted_prepare  # type: ignore[method-assign]
    event.listen(Engine, "before_cursor_execute", _statement)
    event.listen(Engine, "begin", _begin)
    event.listen(Engine, "commit", _commit)
    event.listen(Engine, "rollback", _rollback)


def _trace_file() -> Any:
    pid = os.getpid()
    if _trace["pid"] != pid:
        directory = os.environ["BENCH_TRACE_DIR"]
        _trace["pid"] = pid
        _trace["file"] = open(os.path.join(directory, f"{pid}.jsonl"), "a", buffering=1)  # noqa: SIM115
    return _trace["file"]


def _redis() -> Any:
    client = _trace["redis"]
    if client is None or client[0] != os.getpid():
        import redis

        url = os.environ.get("BENCH_DONE_URL") or os.environ["THREADS_BROKER_URL"]
        client = _trace["redis"] = (os.getpid(), redis.Redis.from_url(url))
    return client[1]


def _task_key(name: str, args: Any) -> str:
    """The run id of a threads task, or the key of a bare chain."""
    if not args:
        return ""
    if name == "threads.tool":
        return str(args[0]).split(":", 1)[0]
    if name == "threads.step":
        return str(args[0])
    if name in (CHAIN_TASK, STORED_CHAIN_TASK):
        return str(args[1])
    return ""


def _install_worker_side() -> None:
    tasks_module = sys.modules.get("tasks")
    app = getattr(tasks_module, "app", None)
    if app is None or not os.environ.get("BENCH_TRACE_DIR"):
        return
    from celery.signals import task_postrun, task_prerun, worker_process_init, worker_process_shutdown

    install_sql_counters()
    time_model_layer(_add_model_cpu)
    # A result backend for the "stored results" chain only (DESIGN section 11 measured a bare
    # chain with one); every other task ignores results (task_ignore_result).
    if os.environ["THREADS_BROKER_URL"].startswith("redis"):
        app.conf.result_backend = os.environ["THREADS_BROKER_URL"]

    def _chain(task: Any, name: str, remaining: int, key: str) -> str:
        noop()
        if remaining > 0:
            task_id = f"{key}:{remaining - 1}"
            task.app.send_task(
                name,
                args=[remaining - 1, key],
                task_id=task_id,
                argsrepr=task_id,
                retry=True,
                retry_policy={"max_retries": 2, "interval_start": 0.1, "interval_step": 0.2},
            )
            return "next"
        return "last"

    @app.task(name=CHAIN_TASK, bind=True, acks_late=True, reject_on_worker_lost=True)
    def noop_chain(self: Any, remaining: int, key: str) -> str:
        """A bare task doing the tool's no-op, then enqueueing the next link of the chain."""
        return _chain(self, CHAIN_TASK, remaining, key)

    @app.task(name=STORED_CHAIN_TASK, bind=True, acks_late=True, reject_on_worker_lost=True, ignore_result=False)
    def noop_chain_stored(self: Any, remaining: int, key: str) -> str:
        """The same, storing each task's result in the Redis result backend."""
        return _chain(self, STORED_CHAIN_TASK, remaining, key)

    if os.environ.get("BENCH_PROFILE") in ("cpu", "wall"):
        # cProfile each pool process (BENCH_PROFILE=cpu: CPU time, wall: elapsed time); stats
        # land in $BENCH_TRACE_DIR/<pid>.prof at shutdown.
        import cProfile

        profile = cProfile.Profile(time.process_time if os.environ["BENCH_PROFILE"] == "cpu" else time.perf_counter)
        # BENCH_PROFILE_TASKS (task names, comma-separated): profile only inside those tasks,
        # from task_prerun to task_postrun (the window the CPU per task is measured over).
        only_tasks = frozenset(filter(None, os.environ.get("BENCH_PROFILE_TASKS", "").split(",")))

        @worker_process_init.connect(weak=False)
        def _start_profile(**_: Any) -> None:
            if not only_tasks:
                profile.enable()

        @task_prerun.connect(weak=False)
        def _profile_task(task: Any = None, **_: Any) -> None:
            if getattr(task, "name", "") in only_tasks:
                profile.enable()

        @task_postrun.connect(weak=False)
        def _unprofile_task(task: Any = None, **_: Any) -> None:
            if getattr(task, "name", "") in only_tasks:
                profile.disable()

        @worker_process_shutdown.connect(weak=False)
        def _dump_profile(**_: Any) -> None:
            profile.disable()
            profile.dump_stats(os.path.join(os.environ["BENCH_TRACE_DIR"], f"{os.getpid()}.prof"))

    if os.environ.get("BENCH_GC"):
        # Each pool process's cyclic garbage collections (count and CPU time by generation, and
        # the objects frozen out of them) land in $BENCH_TRACE_DIR/<pid>.gc.json at shutdown.
        import gc

        collected: dict[str, list[float]] = {}
        started_at = [0.0]

        def _time_collection(phase: str, info: dict[str, Any]) -> None:
            if phase == "start":
                started_at[0] = time.process_time()
                return
            entry = collected.setdefault(str(info["generation"]), [0, 0.0])
            entry[0] += 1
            entry[1] += time.process_time() - started_at[0]

        @worker_process_init.connect(weak=False)
        def _count_collections(**_: Any) -> None:
            gc.callbacks.append(_time_collection)

        @worker_process_shutdown.connect(weak=False)
        def _dump_collections(**_: Any) -> None:
            path = os.path.join(os.environ["BENCH_TRACE_DIR"], f"{os.getpid()}.gc.json")
            with open(path, "w") as f:
                json.dump({"collections": collected, "frozen": gc.get_freeze_count()}, f)

    @task_prerun.connect(weak=False)
    def _before(task: Any = None, **_: Any) -> None:
        counters.reset()
        _trace["model_cpu"] = 0.0
        _trace["model_at"] = 0.0
        _trace["t0"] = time.time()
        _trace["cpu0"] = time.process_time()

    @task_postrun.connect(weak=False)
    def _after(task: Any = None, task_id: str = "", args: Any = None, retval: Any = None, **_: Any) -> None:
        t1 = time.time()
        cpu = time.process_time() - _trace["cpu0"]
        name = getattr(task, "name", "")
        key = _task_key(name, args)
        record = {
            "task": name,
            "id": task_id,
            "key": key,
            "t0": _trace["t0"],
            "t1": t1,
            "cpu": cpu,
            "model_cpu": _trace["model_cpu"],
            "model_at": _trace["model_at"],
            "statements": counters.statements,
            "commits": counters.commits,
            "rollbacks": counters.rollbacks,
            "pings": counters.pings,
            "begins": counters.begins,
            "retval": retval if isinstance(retval, str) else repr(retval),
        }
        _trace_file().write(json.dumps(record) + "\n")
        finished = (
            name == "threads.step" and isinstance(retval, str) and retval.startswith(("completed", "error"))
        ) or (name in (CHAIN_TASK, STORED_CHAIN_TASK) and retval == "last")
        if finished:
            _redis().rpush(DONE_PREFIX + key, json.dumps({"t": t1, "retval": retval}))


_install_worker_side()
