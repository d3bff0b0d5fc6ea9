"""``threads-celery parked``, ``approve``, ``deny`` and ``resolve``: what a person decides.

Each decision is one transaction on the ledger, checked against the call's state (a call that
is not waiting for that decision is left as it is, exit 2). Against PostgreSQL and a broker the
workers carry on at once. Embedded, no worker runs between commands: pass ``--agent`` and the
command continues the run in this process and shows it live, as ``run`` does.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from dataclasses import asdict
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.text import Text

from threads_celery.cli.common import (
    EXIT_OK,
    EmbeddedDb,
    JsonFlag,
    UsageError,
    embedded_db_missing,
    err,
    friendly_errors,
    jsonable,
    load_agent,
    open_threads,
    out,
    principal_of_this_user,
    resolve_spec,
    settings_from_env,
)
from threads_celery.cli.live import STATUS_STYLES, RunView, format_args, shorten
from threads_celery.cli.run import watch_to_end
from threads_celery.exceptions import CallNotFound

if TYPE_CHECKING:
    from threads_celery.client.threads import Threads
    from threads_celery.records import CallRow, Run
    from threads_celery.transitions.pending import PendingCall


class Resolution(str, Enum):
    assume_done = "assume_done"
    assume_not_done = "assume_not_done"


AgentSpec = Annotated[
    str | None,
    typer.Option(
        "--agent",
        metavar="MODULE:AGENT",
        help="The run's agent. Checks edited arguments against its tools; embedded, also continues the run here and shows it.",
    ),
]
Timeout = Annotated[
    float, typer.Option("--timeout", min=0.1, help="With --agent, embedded: seconds to wait for the run to end.")
]


def pending_to_json(call: PendingCall) -> dict[str, Any]:
    data: dict[str, Any] = jsonable(asdict(call))
    return data


@friendly_errors
def parked(
    run: Annotated[str | None, typer.Option("--run", help="Only calls of this run.")] = None,
    db: EmbeddedDb = None,
    as_json: JsonFlag = False,
) -> None:
    """List the tool calls that wait for a person.

    A call is parked when a worker died while it ran, or awaits approval before it runs. A parked call may have run before its worker died and is not safe to repeat: settle it with
    `resolve`. A call awaiting approval has not run: `approve` or `deny` it.

    \b
      threads-celery parked
      threads-celery parked --json
      threads-celery approve run_3f2a...:1:0 --principal alice
      threads-celery resolve run_3f2a...:2:0 assume_done --principal alice --result '"sent"'
    """
    calls: list[PendingCall] = []
    if embedded_db_missing(db) is None:
        threads = open_threads(db, need_broker=False)
        try:
            # With --run, the run's child runs' calls too (kind "child"): answer them here.
            calls = threads.pending(run) if run is not None else threads.parked()
        finally:
            threads.close()
    if as_json:
        sys.stdout.write(json.dumps([pending_to_json(c) for c in calls], indent=2) + "\n")
        return
    if not calls:
        out.print("nothing waits for a person", style="dim")
        return
    # One block per call rather than a table: keys and reasons are long, and a table squeezed
    # into a narrow terminal drops whole columns.
    for c in calls:
        out.print(
            Text.assemble(
                (c.effect_key, "bold"),
                "  ",
                (c.status, STATUS_STYLES.get(c.status, "")),
                "  ",
                (c.tool, "bold yellow"),
                (f"  attempt {c.attempt}", "dim"),
            ),
            soft_wrap=True,
        )
        out.print(Text.assemble(("    args    ", "dim"), format_args(c.args, 200)), overflow="ellipsis", no_wrap=True)
        out.print(
            Text.assemble(("    reason  ", "dim"), shorten(" ".join(c.reason.split()), 300)),
            overflow="ellipsis",
            no_wrap=True,
        )
        # Ids are never cut (they are what the other commands take): each on a line of its own.
        out.print(Text.assemble(("    run     ", "dim"), (c.run_id, "dim")), soft_wrap=True)
        out.print(Text.assemble(("    thread  ", "dim"), (c.thread_id, "dim")), soft_wrap=True)
        if c.kind == "child":
            out.print(Text.assemble(("    child   ", "dim"), (f"{c.agent}  via {c.via}", "dim")), soft_wrap=True)
    runs = sorted({c.run_id for c in calls})
    err.print(
        f"{len(calls)} call{'s' if len(calls) != 1 else ''} in {len(runs)} run{'s' if len(runs) != 1 else ''}",
        style="dim",
    )


@friendly_errors
def approve(
    effect_key: Annotated[
        str, typer.Argument(metavar="EFFECT_KEY", show_default=False, help="The call, as `parked` lists it.")
    ],
    principal: Annotated[
        str,
        typer.Option("--principal", metavar="NAME", help="Who approves (recorded with the call).", show_default=False),
    ],
    args: Annotated[
        str | None,
        typer.Option(
            "--args", metavar="JSON", help="Approve these arguments instead (a JSON object, checked against the tool)."
        ),
    ] = None,
    always: Annotated[
        bool, typer.Option("--always", help="Also always allow this tool on the call's thread (a durable decision).")
    ] = False,
    agent: AgentSpec = None,
    db: EmbeddedDb = None,
    timeout: Timeout = 300.0,
) -> None:
    """Approve a call that awaits approval.

    It runs with its exact arguments, or with edited ones (--args, checked against the tool).
    With --always, later calls of the same tool on that thread run without asking (unless a
    deny or ask rule of the agent says otherwise). A child run's call is approved the same way.

    \b
      threads-celery approve run_3f2a...:1:0 --principal alice
      threads-celery approve run_3f2a...:1:0 --principal alice --args '{"party_size": 4}' --agent myapp.agents:planner
      threads-celery approve run_3f2a...:1:0 --principal alice --agent examples/demo.py:agent   # embedded: continue here
    """
    _require_principal(principal)
    override = _json_object(args, "--args") if args is not None else None
    if override is not None and agent is None and not settings_from_env().agents:
        raise UsageError(
            "--args is checked against the tool's input: name the agent with --agent MODULE:AGENT (or THREADS_AGENTS)"
        )

    def act(threads: Threads, call: PendingCall | None) -> str:
        threads.approve(effect_key, principal=principal, override_args=override, remember=always)
        edited = " with edited arguments" if override is not None else ""
        remembered = f"; {call.tool if call else 'this tool'} is now always allowed on its thread" if always else ""
        return f"✓ approved {effect_key} ({call.tool if call else 'call'}) as {principal}{edited}{remembered}"

    def approved_already(call: CallRow) -> str | None:
        # The same approval again (its run left waiting for a worker): continue, don't refuse.
        if call.approved_by is None or call.status in ("awaiting_approval", "denied") or override is not None:
            return None
        return f"✓ {effect_key} ({call.tool}) was approved already, by {call.approved_by}"

    raise typer.Exit(
        _decide(effect_key, act, agent_spec=agent, db=db, timeout=timeout, decided_already=approved_already)
    )


@friendly_errors
def deny(
    effect_key: Annotated[
        str, typer.Argument(metavar="EFFECT_KEY", show_default=False, help="The call, as `parked` lists it.")
    ],
    reason: Annotated[
        str,
        typer.Option(
            "--reason",
            metavar="TEXT",
            help="Why; the model sees `denied: <reason>` and plans around it.",
            show_default=False,
        ),
    ],
    principal: Annotated[
        str | None,
        typer.Option("--principal", metavar="NAME", help="Who denies [default: cli:<your login>].", show_default=False),
    ] = None,
    agent: AgentSpec = None,
    db: EmbeddedDb = None,
    timeout: Timeout = 300.0,
) -> None:
    """Deny a call that awaits approval.

    It never runs; the model sees `denied: <reason>` and the run goes on without it.

    \b
      threads-celery deny run_3f2a...:2:0 --reason "no emails on weekends"
      threads-celery deny run_3f2a...:2:0 --reason "too expensive" --principal alice
    """
    who = principal if principal is not None else principal_of_this_user()
    _require_principal(who)
    if not reason.strip():
        raise UsageError("--reason must say why (the model sees it)")

    def act(threads: Threads, call: PendingCall | None) -> str:
        threads.deny(effect_key, reason, principal=who)
        return f"✗ denied {effect_key} ({call.tool if call else 'call'}) as {who}: {reason}"

    raise typer.Exit(_decide(effect_key, act, agent_spec=agent, db=db, timeout=timeout))


@friendly_errors
def resolve(
    effect_key: Annotated[
        str, typer.Argument(metavar="EFFECT_KEY", show_default=False, help="The parked call, as `parked` lists it.")
    ],
    resolution: Annotated[
        Resolution,
        typer.Argument(
            metavar="RESOLUTION",
            help="assume_done (the effect happened: record --result) or assume_not_done (it did not: run the call again).",
            show_default=False,
        ),
    ],
    principal: Annotated[
        str,
        typer.Option("--principal", metavar="NAME", help="Who decides (recorded with the call).", show_default=False),
    ],
    result: Annotated[
        str | None,
        typer.Option(
            "--result", metavar="JSON", help="With assume_done: the result the model sees (JSON, or plain text)."
        ),
    ] = None,
    agent: AgentSpec = None,
    db: EmbeddedDb = None,
    timeout: Timeout = 300.0,
) -> None:
    """Settle a parked call: assume_done or assume_not_done.

    A worker died while the call ran, so nobody knows whether its effect happened. Check the outside world (the mailbox, the payment provider) first. assume_not_done runs the
    call again: you accept the risk of doing it twice.

    \b
      threads-celery resolve run_3f2a...:2:0 assume_done --principal alice --result '{"sent": true}'
      threads-celery resolve run_3f2a...:2:0 assume_not_done --principal alice
    """
    _require_principal(principal)
    if result is not None and resolution is Resolution.assume_not_done:
        raise UsageError("--result goes with assume_done (assume_not_done runs the call again, which gives the result)")
    value: Any = None
    if result is not None:
        try:
            value = json.loads(result)
        except json.JSONDecodeError:
            value = result  # plain text is a fine result

    def act(threads: Threads, call: PendingCall | None) -> str:
        if resolution is Resolution.assume_not_done:
            tool = call.tool if call else "the call"
            err.print(
                Text.assemble(
                    ("warning: ", "bold yellow"),
                    (f"{principal} accepts the risk of a duplicate: {tool} may already have run", "yellow"),
                    (f" (attempt {call.attempt})" if call else "", "yellow"),
                    (" and runs again.", "yellow"),
                ),
                soft_wrap=True,
            )
        threads.resolve(effect_key, resolution.value, principal=principal, result=value)
        return f"✓ resolved {effect_key} ({call.tool if call else 'call'}) as {resolution.value} by {principal}"

    raise typer.Exit(_decide(effect_key, act, agent_spec=agent, db=db, timeout=timeout))


# -- shared ------------------------------------------------------------------------------------


def _top_run(threads: Threads, run: Run) -> Run:
    """The run at the top of ``run``'s tree of agent-tool runs (``run`` itself for a root)."""
    for _ in range(32):
        if run.agent_tool_run_id is None:
            return run
        row = threads.inspect_agent_tool_run(run.agent_tool_run_id)
        if row is None or row.parent_run_id is None:
            return run
        run = threads.get_run(row.parent_run_id)
    return run


def _require_principal(principal: str) -> None:
    if not principal.strip():
        raise UsageError("--principal must name who decides")


def _json_object(text: str, option: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UsageError(f"{option} is not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise UsageError(f"{option} must be a JSON object, e.g. '{{\"party_size\": 4}}'")
    return value


def _decide(
    effect_key: str,
    act: Callable[[Threads, PendingCall | None], str],
    *,
    agent_spec: str | None,
    db: Path | None,
    timeout: float,
    decided_already: Callable[[CallRow], str | None] | None = None,
) -> int:
    """Record a decision; embedded with the run's agent loaded (``--agent`` or THREADS_AGENTS),
    continue the run here. Returns the exit code.

    ``decided_already`` says (as the line to print) that the call carries this very decision
    already: embedded, the run is then continued instead of the decision being refused.
    """
    if embedded_db_missing(db) is not None:
        raise CallNotFound(effect_key)
    agent = load_agent(agent_spec) if agent_spec else None
    threads = open_threads(db)
    try:
        if agent is not None:
            threads.registry.add(agent)
        elif threads.settings.agents:
            threads.registry.load(resolve_spec(s) for s in threads.settings.agents)  # for --args checks
        call = next((c for c in threads.parked() if c.effect_key == effect_key), None)
        run_id = call.run_id if call is not None else None
        done: str | None = None
        if call is None and threads.is_embedded and decided_already is not None:
            with threads.store.read() as tx:
                found = tx.get_call_and_run(effect_key)
            if found is not None and not found[1].is_terminal:
                done = decided_already(found[0])
                run_id = found[1].id if done is not None else None
        # A child run's call: continue (and watch) the run at the top of its tree, which is
        # the one the person started and waits on.
        run = _top_run(threads, threads.get_run(run_id)) if run_id is not None else None
        if agent is not None and run is not None and run.agent not in threads.registry:
            raise UsageError(f"run {run.id} belongs to agent {run.agent!r}, which {agent_spec!r} does not load")
        here = threads.is_embedded and run is not None and run.agent in threads.registry
        if not here:
            done = None  # nothing to continue here: the decision is refused as it stands (act says why)
        view = RunView(run_id=run.id, agent=run.agent) if run is not None else None
        if here and view is not None and run is not None:
            # Before deciding: the tasks the decision publishes come to this worker, and what
            # the view holds now was shown when the run stopped; only what comes next is printed.
            threads.start_worker()
            view.add_events(threads.events(run.thread_id))
            view.take_settled()
        out.print(done if done is not None else act(threads, call), style="green", soft_wrap=True)
        if run is None or view is None:
            return EXIT_OK
        if here:
            # What an earlier decision, taken where no worker ran, left in the ledger runs here too.
            threads.pick_up(run.id)
            out.print(Text.assemble(("▶ continuing ", "bold magenta"), (run.agent, "bold"), (f"  {run.id}", "dim")))
            return watch_to_end(
                threads, threads.registry.get(run.agent), run.id, run.thread_id, view,
                timeout=timeout, approve=False, as_json=False, header=False, agent_spec=agent_spec,
            )  # fmt: skip
        if threads.is_embedded:
            err.print(
                f"recorded. Embedded, no worker runs between commands: continue run {run.id} here with "
                f"`threads-celery resume {run.id} --agent MODULE:AGENT` (the module and attribute of agent "
                f"{run.agent!r}), or from a process that loads its agent (`threads-celery api --embedded` "
                "with THREADS_AGENTS).",
                style="yellow",
                soft_wrap=True,
            )
        else:
            err.print(
                f"the workers carry on with run {run.id}: threads-celery events {run.thread_id} --follow",
                style="dim",
                soft_wrap=True,
            )
        return EXIT_OK
    finally:
        threads.close()
