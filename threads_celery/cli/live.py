"""Watching a run (or a whole thread) in the terminal: events in, Rich renderables out.

:class:`RunView` knows nothing about terminals, stores or polling. It is fed a thread's
:class:`~threads_celery.records.Event` values (or its :class:`~threads_celery.records.Message`
values) and snapshots of the :class:`~threads_celery.records.Run`, and renders them: each model
turn, each tool call with its arguments and its result (errors in red), each child agent-tool run
with a progress bar, its phase and its milestones, the final answer in a panel, the status and the
elapsed time. :mod:`threads_celery.cli.watch` holds the thin shells around it that poll the store
and drive a Rich ``Live`` display.

Entries are printed once, when they are *settled* (a turn is settled when every call it made has
a result); only what is still moving stays in the live region. So a long run scrolls like a log,
and the same output makes sense when stdout is a file or a pipe.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from rich.console import Group, RenderableType
from rich.padding import Padding
from rich.panel import Panel
from rich.progress_bar import ProgressBar
from rich.spinner import Spinner
from rich.table import Table
from rich.text import Text

from threads_celery.cli.live_entries import (
    CallEntry,
    ChildRun,
    Entry,
    NoteEntry,
    TurnEntry,
    UserEntry,
    answer_note,
    is_narration,
)

#: Statuses in which a run waits for a person: following it stops there.
from threads_celery.cli.live_format import (
    CHILD_END,
    CHILD_STYLES,
    NEEDS_A_PERSON,
    STATUS_MARKS,
    STATUS_STYLES,
    STOP_STATUSES,
    WAITING_NOTES,
    format_args,
    format_result,
    input_label,
    message_from_event,
    shorten,
)
from threads_celery.cli.live_partial import PartialTurn
from threads_celery.records import TERMINAL_STATUSES, CallTimelineEntry, Event, Message, Run, ToolResult


class RunView:
    """Renders one run (or, with ``thread_id``, a whole thread) from its events and snapshots.

    Feed it with :meth:`add_event` (events, in ``seq`` order) or :meth:`add` (messages, in
    ``seq`` order), and :meth:`update` (the run). With ``run_id`` set, messages and child runs of
    other runs on the same thread are ignored. Safe to render from Rich's refresh thread while the
    caller feeds it.
    """

    def __init__(
        self,
        *,
        run_id: str | None = None,
        agent: str | None = None,
        thread_id: str | None = None,
        arg_limit: int = 160,
        result_limit: int = 400,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.run_id = run_id
        self.agent = agent
        self.thread_id = thread_id
        self.arg_limit = arg_limit
        self.result_limit = result_limit
        self.run: Run | None = None
        self.last_seq = -1
        self.last_event_seq = 0
        self._clock = clock
        self._watch_started = clock()
        self._entries: list[Entry] = []
        self._calls: dict[str, CallEntry] = {}
        self._children: dict[str, ChildRun] = {}
        self._taken = 0
        self._turns = 0
        self._orphans: list[ToolResult] = []
        self._spinners: dict[str, Spinner] = {}
        self._lock = threading.RLock()
        #: The model turn being written, from the live deltas when the view is fed them.
        self.partial = PartialTurn()
        #: Notes on calls a person answered (who approved, denied or resolved them), by effect
        #: key: shown under each call as it is added (see :meth:`note_answers`).
        self._answers: dict[str, tuple[str, str]] = {}

    # -- feeding ---------------------------------------------------------------------------

    def add(self, message: Message) -> None:
        """Take in one stored message (duplicates and older messages are ignored)."""
        with self._lock:
            if message.seq <= self.last_seq:
                return
            self.last_seq = message.seq
            narration = is_narration(message)
            if self.run_id is not None and message.run_id not in (None, self.run_id) and not narration:
                return
            if narration:
                # A narrated milestone of a background child: a status line, not a model turn.
                self._entries.append(NoteEntry(Text.assemble(("  ◆ ", "magenta"), (message.text, "magenta"))))
            elif message.role == "user":
                self._entries.append(UserEntry(message.text))
            elif message.role == "assistant":
                self.partial.clear()
                self._turns += 1
                turn = TurnEntry(self._turns, message.text, [CallEntry(c) for c in message.tool_calls])
                for entry in turn.calls:
                    self._calls[entry.call.id] = entry
                    answered = self._answers.get(entry.call.effect_key)
                    if answered is not None:
                        entry.notes.append(Text(f"    {answered[0]}", style=answered[1]))
                self._entries.append(turn)
            elif message.tool_result is not None:
                called = self._calls.get(message.tool_result.call_id)
                if called is None:
                    # The call was made before this view started watching; show the result alone.
                    self._orphans.append(message.tool_result)
                else:
                    called.result = message.tool_result

    def add_all(self, messages: Iterable[Message]) -> None:
        for message in messages:
            self.add(message)

    def add_event(self, event: Event) -> None:
        """Take in one event of the thread's log (duplicates and older events are ignored)."""
        with self._lock:
            if event.seq <= self.last_event_seq:
                return
            self.last_event_seq = event.seq
            if event.type == "message":
                message = message_from_event(event)
                if message is not None:
                    self.add(message)
            elif event.type == "run":
                self._run_event(event)
            elif event.type.startswith("agent_tool.") and (self.run_id is None or event.run_id in (None, self.run_id)):
                self._child_event(event)

    def add_events(self, events: Iterable[Event]) -> None:
        for event in events:
            self.add_event(event)

    def _run_event(self, event: Event) -> None:
        payload = event.payload
        if self.agent is None and payload.get("agent"):
            self.agent = payload["agent"]
        if self.thread_id is None:
            return  # following one run: its snapshots (update) say where it is
        status, run_id = payload.get("status", ""), payload.get("run_id", event.run_id)
        waiting = (
            next((c for c in self._calls.values() if c.result is None), None) if status in NEEDS_A_PERSON else None
        )
        if waiting is not None:
            # Under the call it waits on, not after the turn (which settles only once it ran).
            waiting.notes.append(Text(f"    ⏸ {status.replace('_', ' ')}", style="yellow"))
            return
        if status == "queued":
            line = Text.assemble(
                ("▶ run ", "bold magenta"), (str(run_id), "dim"), (f"  {payload.get('agent', '')}", "bold")
            )
        elif status in STOP_STATUSES:
            line = Text.assemble(
                (
                    f"{STATUS_MARKS.get(status, '•')} run {run_id} {status.replace('_', ' ')}",
                    STATUS_STYLES.get(status, ""),
                ),
                (f": {payload['error']}" if payload.get("error") else "", "red"),
            )
        else:
            return  # running / waiting flip with every step: not worth a line
        self._entries.append(NoteEntry(line))

    def _child_event(self, event: Event) -> None:
        payload = event.payload
        run_id = str(payload.get("run_id", ""))
        child = self._children.get(run_id)
        if event.type == "agent_tool.started":
            if child is None:
                name = str(payload.get("display") or payload.get("agent_type") or "agent")
                child = self._children[run_id] = ChildRun(
                    run_id, name, input_label(str(payload.get("input_preview", "")))
                )
                child.call = self._call_of(run_id, payload.get("parent_tool_call_id"))
                if child.call is not None:
                    child.call.children.append(child)
            return
        if child is None:
            child = self._children[run_id] = ChildRun(run_id, run_id)  # started before the replay window
        if event.type == "agent_tool.progress":
            if payload.get("fraction") is not None:
                child.fraction = min(1.0, max(0.0, float(payload["fraction"])))
            child.phase = payload.get("phase", child.phase)
            child.message = payload.get("message", child.message)
        elif event.type == "agent_tool.milestone":
            if payload.get("name") and payload["name"] not in child.milestones:
                child.milestones.append(str(payload["name"]))
        elif event.type == "agent_tool.chunk":
            body = payload.get("body") or {}
            names = body.get("tool_calls") or []
            child.activity = (
                f"calling {', '.join(names)}"
                if names
                else shorten(" ".join(str(body.get("text", "")).split()), 60) or None
            )
        elif event.type in CHILD_END and not child.is_terminal:
            child.status = CHILD_END[event.type]
            if child.status == "completed":
                child.fraction = 1.0
                child.outcome = payload.get("summary") or None
            else:
                reason = payload.get("reason")
                child.outcome = payload.get("error") or reason
                if reason and child.status == "interrupted":
                    child.outcome = f"{reason}: {payload.get('error', '')}".rstrip(": ")
            if child.call is not None and child.call.result is None:
                child.ended_with_call = True
            else:
                self._entries.append(NoteEntry(self._children_grid([child], indent=2)))

    def _call_of(self, child_run_id: str, parent_tool_call_id: Any) -> CallEntry | None:
        """The call that started a child: by id when the event names it, else by run id.

        The runtime names an agent tool's child ``agent-tool:<effect key>``, and a tool's
        ``ctx.run_agent_tool`` names its children ``agent-tool:<effect key>:<n>``.
        """
        if parent_tool_call_id and parent_tool_call_id in self._calls:
            return self._calls[parent_tool_call_id]
        for entry in self._calls.values():
            prefix = f"agent-tool:{entry.call.effect_key}"
            if child_run_id == prefix or child_run_id.startswith(prefix + ":"):
                return entry
        return None

    def note_answers(self, calls: Iterable[CallTimelineEntry]) -> None:
        """Show, under each of ``calls`` a person answered, who did and how (the ledger's
        ``approved_by``, ``resolved_by``): what a live ``threads-celery run`` notes as it
        answers, for a replay. Call it before the calls' messages are added."""
        with self._lock:
            for call in calls:
                note = answer_note(call)
                if note is not None:
                    self._answers[call.effect_key] = note

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

    @property
    def children(self) -> list[ChildRun]:
        """The child agent-tool runs seen so far, in the order they started."""
        with self._lock:
            return list(self._children.values())

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
        """What is still moving: unsettled entries, child runs in the background, the status."""
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
        if self.thread_id is not None and self.run is None:
            return Text.assemble(
                ("▶ thread ", "bold magenta"), (self.thread_id, "dim"), (f"  {self.agent or ''}", "bold")
            )
        title = Text.assemble(("▶ ", "bold magenta"), (self.agent or "agent", "bold"))
        if self.run is not None:
            title.append(f"  {self.run.id}", style="dim")
        elif self.run_id is not None:
            title.append(f"  {self.run_id}", style="dim")
        return title

    def _render_entry(self, entry: Entry) -> RenderableType:
        if isinstance(entry, NoteEntry):
            return entry.line
        if isinstance(entry, UserEntry):
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

    def _render_call(self, entry: CallEntry) -> RenderableType:
        call = entry.call
        head = Text.assemble(
            ("  ⚙ ", "yellow"),
            (call.name, "bold yellow"),
            ("(", "dim"),
            format_args(call.args, self.arg_limit),
            (")", "dim"),
        )
        result = entry.result
        # While the call waits, its children are drawn under it; once it has a result, only
        # those that ended with it stay, and the ones still running move to the live region.
        shown = [c for c in entry.children if result is None or c.ended_with_call]
        moved = [c for c in entry.children if result is not None and not c.ended_with_call]
        children: list[RenderableType] = (
            [self._children_grid(shown, indent=4, summaries=result is None)] if shown else []
        )
        children.extend(Text(f"    ⇢ started {c.name} in the background", style="dim") for c in moved)
        if result is None:
            return Group(head, *entry.notes, *children, self._pending_line(call.id))
        body = format_result(result.content, limit=self.result_limit)
        if result.is_error:
            line = Text.assemble(("    ✗ ", "bold red"), (body, "red"))
        else:
            line = Text.assemble(("    ↳ ", "green"), (body, ""))
        return Group(head, *entry.notes, *children, line)

    def _children_grid(self, children: list[ChildRun], *, indent: int, summaries: bool = True) -> RenderableType:
        """One row per child: name, status, progress bar, percent, milestones, phase/message.

        ``summaries=False`` leaves out a completed child's summary (its call's result shows it).
        """
        # Only the last column may shrink: Rich takes width evenly from every column of a table
        # that has no wrappable one, which can squeeze a short column (the status) to nothing.
        grid = Table.grid(padding=(0, 1))
        grid.add_column(no_wrap=True, min_width=24, max_width=36)
        grid.add_column(no_wrap=True)
        grid.add_column(no_wrap=True)
        grid.add_column(no_wrap=True, justify="right", min_width=4)
        grid.add_column()
        for child in children:
            style = CHILD_STYLES.get(child.status, "")
            active = not child.is_terminal
            failed = child.status in ("error", "aborted")
            label = Text.assemble(
                (f"{STATUS_MARKS.get(child.status, '◌')} ", style),
                (child.name, "bold"),
                (f" · {child.label}" if child.label else "", "dim"),
                overflow="ellipsis",
            )
            bar = ProgressBar(
                total=1.0,
                completed=child.fraction or 0.0,
                width=24,
                pulse=active and child.fraction is None,
                complete_style="red" if failed else ("yellow" if child.status == "interrupted" else "cyan"),
                finished_style="green",
            )
            percent = f"{child.fraction:.0%}" if child.fraction is not None else ""
            detail = Text(no_wrap=True, overflow="ellipsis")
            for name in child.milestones:
                detail.append(f"◆ {name}", style="bold magenta")
                detail.append("  ")
            words = [w for w in (child.phase, child.message) if w] if active else [child.outcome or ""]
            if child.status == "completed" and not summaries:
                words = []
            if active and not words and child.activity:
                words = [child.activity]
            detail.append(" · ".join(" ".join(w.split()) for w in words if w), style="red" if failed else "dim")
            grid.add_row(label, Text(child.status, style=style), bar, percent, detail)
        return Padding(grid, (0, 0, 0, indent))

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
        floating = [c for c in self._children.values() if c.floating]
        if floating:
            parts.append(self._children_grid(floating, indent=2))
        run = self.run
        if run is None:
            if self.thread_id is None:
                parts.append(self._spinner("__status", "starting…"))
            return parts
        if run.status not in STOP_STATUSES:
            last = self._entries[-1] if self._entries else None
            if run.status == "waiting":
                activity = "waiting on a child run"
            elif isinstance(last, TurnEntry) and not last.settled:
                activity = "tools running"  # the call's own spinner shows what
            elif run.status == "queued":
                activity = "queued: waiting for the thread or a worker"
            else:
                activity = "model writing" if self.partial.writing else "model thinking"
            writing = self.partial.render()
            if writing is not None:
                parts.append(writing)
            parts.append(self._spinner("__status", f"{activity} · {self.elapsed():.1f}s"))
            return parts
        style = STATUS_STYLES.get(run.status, "bold")
        line = Text.assemble(
            (f"{STATUS_MARKS.get(run.status, '•')} {run.status.replace('_', ' ')}", style),
            (f" in {self.elapsed():.2f}s", "dim"),
            (f" · {self._turns} model turn{'s' if self._turns != 1 else ''}", "dim"),
            (f" · {len(self._calls)} tool call{'s' if len(self._calls) != 1 else ''}", "dim"),
        )
        if self._children:
            line.append(f" · {len(self._children)} child run{'s' if len(self._children) != 1 else ''}", style="dim")
        if run.error and run.status in TERMINAL_STATUSES:
            parts.append(
                Panel(
                    Text(run.error, style="red"),
                    title=Text(run.status, style="bold red"),
                    title_align="left",
                    border_style="red",
                    padding=(0, 1),
                )
            )
        note = WAITING_NOTES.get(run.status)
        if note:
            line.append(f" · {note}", style="yellow")
        elif floating:
            line.append(" · background child runs still going", style="cyan")
        parts.append(line)
        return parts

    def elapsed(self) -> float:
        """Seconds from the run's creation to its end (or to now, while it runs)."""
        run = self.run
        if run is not None and run.created_at is not None and run.finished_at is not None:
            return max(0.0, (run.finished_at - run.created_at).total_seconds())
        return max(0.0, self._clock() - self._watch_started)


__all__ = [
    "NEEDS_A_PERSON",
    "STATUS_STYLES",
    "STOP_STATUSES",
    "ChildRun",
    "RunView",
    "answer_note",
    "format_args",
    "format_result",
    "message_from_event",
    "shorten",
]
