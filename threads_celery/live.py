"""Watching a run in the terminal: stored messages in, Rich renderables out.

:class:`RunView` knows nothing about terminals, stores or polling. It is fed the
:class:`~threads_celery.records.Message` values of a thread and snapshots of its
:class:`~threads_celery.records.Run`, and renders them: each model turn, each tool call with its
arguments and its result (errors in red), the final answer in a panel, the status and the elapsed
time. :func:`follow_run` is the thin shell around it that polls the store and drives a Rich
``Live`` display.

Entries are printed once, when they are *settled* (a turn is settled when every call it made has
a result); only what is still moving stays in the live region. So a long run scrolls like a log,
and the same output makes sense when stdout is a file or a pipe.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass, field
from typing import Protocol

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.markup import escape
from rich.padding import Padding
from rich.panel import Panel
from rich.spinner import Spinner
from rich.table import Table
from rich.text import Text

from .records import TERMINAL_STATUSES, Message, Run, ToolCall, ToolResult

#: Statuses in which a run waits for a person: following it stops there.
NEEDS_A_PERSON: frozenset[str] = frozenset({"parked", "awaiting_approval", "awaiting_variable"})
#: Statuses at which :func:`follow_run` stops watching.
STOP_STATUSES: frozenset[str] = TERMINAL_STATUSES | NEEDS_A_PERSON

STATUS_STYLES: dict[str, str] = {
    "queued": "cyan",
    "running": "cyan",
    "waiting": "cyan",
    "completed": "bold green",
    "error": "bold red",
    "aborted": "bold red",
    "interrupted": "bold red",
    "parked": "bold yellow",
    "awaiting_approval": "bold yellow",
    "awaiting_variable": "bold yellow",
}
STATUS_MARKS: dict[str, str] = {
    "completed": "✔",
    "error": "✘",
    "aborted": "✘",
    "interrupted": "✘",
    "parked": "⏸",
    "awaiting_approval": "⏸",
    "awaiting_variable": "⏸",
}
_WAITING_NOTES: dict[str, str] = {
    "parked": "a tool call may have run and is not safe to repeat; a person must decide",
    "awaiting_approval": "a tool call waits for approval",
    "awaiting_variable": "a tool call waits for a variable to be set",
}


def shorten(text: str, limit: int) -> str:
    """``text`` cut to ``limit`` characters, with an ellipsis when something was cut."""
    if limit <= 0 or len(text) <= limit:
        return text
    return text[: max(0, limit - 1)] + "…"


def format_args(raw: str, limit: int = 160) -> str:
    """A call's JSON arguments as ``key=value`` pairs on one line (raw text if not an object)."""
    try:
        data = json.loads(raw) if raw else {}
    except json.JSONDecodeError:
        return shorten(" ".join(raw.split()), limit)
    if not isinstance(data, dict):
        return shorten(json.dumps(data, ensure_ascii=False), limit)
    pairs = (f"{key}={json.dumps(value, ensure_ascii=False)}" for key, value in data.items())
    return shorten(", ".join(pairs), limit)


def format_result(content: str, *, limit: int = 400, max_lines: int = 6) -> str:
    """A tool result for display: JSON compacted, long text cut by characters and lines."""
    text = content.strip()
    try:
        value = json.loads(text)
    except (json.JSONDecodeError, ValueError):
        pass
    else:
        if isinstance(value, (dict, list)):
            text = json.dumps(value, ensure_ascii=False, separators=(", ", ": "))
    lines = text.splitlines() or [""]
    if len(lines) > max_lines:
        lines = [*lines[:max_lines], f"… ({len(lines) - max_lines} more lines)"]
    return shorten("\n".join(lines), limit)


# -- what the view holds ----------------------------------------------------------------------


@dataclass
class _CallEntry:
    call: ToolCall
    result: ToolResult | None = None
    notes: list[Text] = field(default_factory=list)


@dataclass
class _UserEntry:
    text: str

    @property
    def settled(self) -> bool:
        return True


@dataclass
class _TurnEntry:
    number: int
    text: str
    calls: list[_CallEntry] = field(default_factory=list)

    @property
    def is_answer(self) -> bool:
        """A model turn that calls no tool is the run's answer."""
        return not self.calls

    @property
    def settled(self) -> bool:
        return all(c.result is not None for c in self.calls)


_Entry = _UserEntry | _TurnEntry


class RunView:
    """Renders one run (or a whole thread) from its stored messages and run snapshots.

    Feed it with :meth:`add` (messages, in ``seq`` order) and :meth:`update` (the run). With
    ``run_id`` set, messages of other runs on the same thread are ignored. Safe to render from
    Rich's refresh thread while the caller feeds it.
    """

    def __init__(
        self,
        *,
        run_id: str | None = None,
        agent: str | None = None,
        arg_limit: int = 160,
        result_limit: int = 400,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.run_id = run_id
        self.agent = agent
        self.arg_limit = arg_limit
        self.result_limit = result_limit
        self.run: Run | None = None
        self.last_seq = -1
        self._clock = clock
        self._watch_started = clock()
        self._entries: list[_Entry] = []
        self._calls: dict[str, _CallEntry] = {}
        self._taken = 0
        self._turns = 0
        self._orphans: list[ToolResult] = []
        self._spinners: dict[str, Spinner] = {}
        self._lock = threading.RLock()

    # -- feeding ---------------------------------------------------------------------------

    def add(self, message: Message) -> None:
        """Take in one stored message (duplicates and older messages are ignored)."""
        with self._lock:
            if message.seq <= self.last_seq:
                return
            self.last_seq = message.seq
            if self.run_id is not None and message.run_id not in (None, self.run_id):
                return
            if message.role == "user":
                self._entries.append(_UserEntry(message.text))
            elif message.role == "assistant":
                self._turns += 1
                turn = _TurnEntry(self._turns, message.text, [_CallEntry(c) for c in message.tool_calls])
                for entry in turn.calls:
                    self._calls[entry.call.id] = entry
                self._entries.append(turn)
            elif message.tool_result is not None:
                entry = self._calls.get(message.tool_result.call_id)
                if entry is None:
                    # The call was made before this view started watching; show the result alone.
                    self._orphans.append(message.tool_result)
                else:
                    entry.result = message.tool_result

    def add_all(self, messages: Iterable[Message]) -> None:
        for message in messages:
            self.add(message)

    def note_call(self, effect_key: str, note: str, *, style: str = "green") -> bool:
        """Show ``note`` under a call (e.g. who approved it). False if the view has no such call."""
        with self._lock:
            for entry in self._calls.values():
                if entry.call.effect_key == effect_key:
                    entry.notes.append(Text(f"    {note}", style=style))
                    return True
            return False

    def update(self, run: Run) -> None:
        """Take in the run's latest snapshot."""
        with self._lock:
            self.run = run
            if self.agent is None:
                self.agent = run.agent

    @property
    def status(self) -> str | None:
        return self.run.status if self.run is not None else None

    # -- rendering -------------------------------------------------------------------------

    def take_settled(self) -> list[RenderableType]:
        """Renderables for entries that will not change any more and were not taken before.

        Taken in order: an unsettled entry holds back every entry after it.
        """
        with self._lock:
            out: list[RenderableType] = []
            while self._taken < len(self._entries) and self._entries[self._taken].settled:
                out.append(self._render_entry(self._entries[self._taken]))
                self._taken += 1
            return out

    def render_live(self) -> RenderableType:
        """What is still moving: unsettled entries, then the status line."""
        with self._lock:
            parts = [self._render_entry(e) for e in self._entries[self._taken :]]
            parts.extend(self._render_footer())
            return Group(*parts)

    def render(self) -> RenderableType:
        """Everything: the header, every entry, and the status line."""
        with self._lock:
            parts: list[RenderableType] = [self._render_header()]
            parts.extend(self._render_entry(e) for e in self._entries)
            parts.extend(self._render_footer())
            return Group(*parts)

    def __rich__(self) -> RenderableType:
        return self.render_live()

    def render_header(self) -> RenderableType:
        with self._lock:
            return self._render_header()

    def _render_header(self) -> RenderableType:
        title = Text.assemble(("▶ ", "bold magenta"), (self.agent or "agent", "bold"))
        if self.run is not None:
            title.append(f"  {self.run.id}", style="dim")
        elif self.run_id is not None:
            title.append(f"  {self.run_id}", style="dim")
        return title

    def _render_entry(self, entry: _Entry) -> RenderableType:
        if isinstance(entry, _UserEntry):
            return Text.assemble(("you  ", "bold blue"), entry.text)
        if entry.is_answer:
            return Panel(
                Text(entry.text or "(empty answer)"),
                title=Text("answer", style="bold green"),
                title_align="left",
                border_style="green",
                padding=(0, 1),
            )
        rows: list[RenderableType] = [
            Text.assemble((f"turn {entry.number}", "bold magenta"), ("  " + entry.text if entry.text else "", "italic"))
        ]
        rows.extend(self._render_call(c) for c in entry.calls)
        return Group(*rows)

    def _render_call(self, entry: _CallEntry) -> RenderableType:
        call = entry.call
        head = Text.assemble(
            ("  ⚙ ", "yellow"), (call.name, "bold yellow"), ("(", "dim"), format_args(call.args, self.arg_limit), (")", "dim")
        )
        result = entry.result
        if result is None:
            return Group(head, *entry.notes, self._pending_line(call.id))
        body = format_result(result.content, limit=self.result_limit)
        if result.is_error:
            line = Text.assemble(("    ✗ ", "bold red"), (body, "red"))
        else:
            line = Text.assemble(("    ↳ ", "green"), (body, ""))
        return Group(head, *entry.notes, line)

    def _pending_line(self, key: str) -> RenderableType:
        status = self.status
        if status in NEEDS_A_PERSON:
            assert status is not None
            return Text(f"    ⏸ {status.replace('_', ' ')}", style="yellow")
        if status in TERMINAL_STATUSES:
            return Text("    – no result", style="dim")
        return Padding(self._spinner(key, "running…"), (0, 0, 0, 4))

    def _spinner(self, key: str, text: str) -> Spinner:
        # One Spinner per key, kept across renders, so that Live's refreshes animate it.
        spinner = self._spinners.get(key)
        if spinner is None:
            spinner = self._spinners[key] = Spinner("dots", style="cyan")
        spinner.update(text=Text(text, style="dim"))
        return spinner

    def _render_footer(self) -> list[RenderableType]:
        parts: list[RenderableType] = []
        for result in self._orphans:
            parts.append(
                Text.assemble(
                    ("  ↳ ", "green"),
                    (f"{result.name}: ", "bold"),
                    (format_result(result.content, limit=self.result_limit), "red" if result.is_error else ""),
                )
            )
        run = self.run
        if run is None:
            parts.append(self._spinner("__status", "starting…"))
            return parts
        if run.status not in STOP_STATUSES:
            last = self._entries[-1] if self._entries else None
            if isinstance(last, _TurnEntry) and not last.settled:
                activity = "tools running"  # the call's own spinner shows what
            elif run.status == "queued":
                activity = "queued: waiting for the thread or a worker"
            else:
                activity = "model thinking"
            parts.append(self._spinner("__status", f"{activity} · {self.elapsed():.1f}s"))
            return parts
        style = STATUS_STYLES.get(run.status, "bold")
        line = Text.assemble(
            (f"{STATUS_MARKS.get(run.status, '•')} {run.status.replace('_', ' ')}", style),
            (f" in {self.elapsed():.2f}s", "dim"),
            (f" · {self._turns} model turn{'s' if self._turns != 1 else ''}", "dim"),
            (f" · {len(self._calls)} tool call{'s' if len(self._calls) != 1 else ''}", "dim"),
        )
        if run.error and run.status in TERMINAL_STATUSES:
            parts.append(
                Panel(Text(run.error, style="red"), title=Text(run.status, style="bold red"), title_align="left", border_style="red", padding=(0, 1))
            )
        note = _WAITING_NOTES.get(run.status)
        if note:
            line.append(f" · {note}", style="yellow")
        parts.append(line)
        return parts

    def elapsed(self) -> float:
        """Seconds from the run's creation to its end (or to now, while it runs)."""
        run = self.run
        if run is not None and run.created_at is not None and run.finished_at is not None:
            return max(0.0, (run.finished_at - run.created_at).total_seconds())
        return max(0.0, self._clock() - self._watch_started)


def run_summary(run: Run) -> RenderableType:
    """A run's fields as a two-column table (for ``runs show``)."""
    table = Table.grid(padding=(0, 2))
    table.add_column(style="bold")
    table.add_column()
    table.add_row("run", run.id)
    table.add_row("thread", run.thread_id)
    table.add_row("agent", run.agent)
    table.add_row("status", Text(run.status, style=STATUS_STYLES.get(run.status, "")))
    table.add_row("step", str(run.step))
    for name in ("created_at", "started_at", "finished_at"):
        value = getattr(run, name)
        if value is not None:
            table.add_row(name.replace("_at", ""), value.isoformat(timespec="milliseconds"))
    if run.output:
        table.add_row("output", escape(shorten(run.output, 400)))
    if run.error:
        table.add_row("error", Text(run.error, style="red"))
    return table


# -- the polling shell -------------------------------------------------------------------------


class RunSource(Protocol):
    """What :func:`follow_run` reads: a :class:`~threads_celery.client.Threads` fits."""

    def get_run(self, run_id: str) -> Run: ...

    def messages(self, thread_id: str, *, after: int = -1) -> list[Message]: ...


def follow_run(
    source: RunSource,
    run_id: str,
    thread_id: str,
    *,
    console: Console,
    view: RunView | None = None,
    timeout: float | None = None,
    poll_interval: float = 0.05,
    stop_at: Collection[str] = STOP_STATUSES,
    header: bool = True,
) -> Run:
    """Show a run until it reaches a status in ``stop_at`` or ``timeout`` seconds pass.

    Settled entries are printed as they settle; on a terminal, what is still moving is shown in
    a Rich ``Live`` region below them, which is cleared when watching stops. Returns the last run
    snapshot read (the caller tells a timeout by its status). Print ``view.render_live()`` to
    show where the run stopped, or call again with the same ``view`` and ``header=False`` to
    carry on watching after, say, an approval.
    """
    view = view or RunView(run_id=run_id)
    deadline = None if timeout is None else time.monotonic() + timeout
    if header:
        console.print(view.render_header())

    def poll(printer: Console) -> Run:
        # Read the run first: messages read after it are at least as new, so the last messages
        # of a run that just ended are never missed.
        run = source.get_run(run_id)
        view.add_all(source.messages(thread_id, after=view.last_seq))
        view.update(run)
        for renderable in view.take_settled():
            printer.print(renderable)
        return run

    def watch(printer: Console) -> Run:
        while True:
            run = poll(printer)
            if run.status in stop_at or (deadline is not None and time.monotonic() >= deadline):
                return run
            time.sleep(poll_interval)

    if not console.is_terminal or console.is_dumb_terminal:
        # A file or a pipe: no cursor tricks, just the log of settled entries.
        return watch(console)
    with Live(
        view, console=console, refresh_per_second=12, transient=True, redirect_stdout=False, redirect_stderr=False
    ) as live:
        return watch(live.console)


__all__ = [
    "NEEDS_A_PERSON",
    "STOP_STATUSES",
    "RunSource",
    "RunView",
    "follow_run",
    "format_args",
    "format_result",
    "run_summary",
    "shorten",
]
