"""``threads-celery thread ...`` run as a user runs it: a subprocess on the embedded default.

The demo agent runs first (its idempotent and unguarded tools approved), then its thread is
rewound and forked from the command line, and each step is checked against the ledger as the
command's JSON shows it.
"""

from __future__ import annotations

import json
from pathlib import Path

from tests.acceptance.test_cli import DEMO, cli, explain


def test_rewind_and_fork_from_the_command_line(tmp_path: Path) -> None:
    ran = cli("run", DEMO, "plan a dinner in Rome", "--approve", cwd=tmp_path)
    assert ran.returncode == 0, explain(ran)
    listed = cli("runs", "list", "--json", cwd=tmp_path)
    [run] = json.loads(listed.stdout)
    thread = run["thread_id"]
    shown = cli("thread", "messages", thread, "--json", cwd=tmp_path)
    messages = json.loads(shown.stdout)
    assert messages[0]["role"] == "user" and len(messages) > 2, explain(shown)

    forked = cli("thread", "fork", thread, "--at", "0", "--to", "thread_copy", "--json", cwd=tmp_path)
    assert forked.returncode == 0, explain(forked)
    fork = json.loads(forked.stdout)
    assert fork["thread_id"] == "thread_copy" and fork["source_thread_id"] == thread
    # The demo's unguarded booking ran after message 0: a repeat on the fork asks first.
    assert any(p["effect"] == "unguarded" for p in fork["prior_effects"]), fork
    copied = json.loads(cli("thread", "messages", "thread_copy", "--json", cwd=tmp_path).stdout)
    assert [m["text"] for m in copied] == [messages[0]["text"]]

    rewound = cli("thread", "rewind", thread, "--at", "0", cwd=tmp_path)
    assert rewound.returncode == 0 and "prior effect" in rewound.stdout, explain(rewound)
    kept = json.loads(cli("thread", "messages", thread, "--json", cwd=tmp_path).stdout)
    assert [m["seq"] for m in kept] == [0]
    everything = json.loads(cli("thread", "messages", thread, "--all", "--json", cwd=tmp_path).stdout)
    assert len(everything) == len(messages) and all(m["superseded_by"] for m in everything[1:])
    [branch] = json.loads(cli("thread", "branches", thread, "--json", cwd=tmp_path).stdout)
    assert branch["kind"] == "rewind" and branch["from_seq"] == 1 and branch["created_by"].startswith("cli")

    # A point that is not on the current branch, and a thread that does not exist: exit 2, one line.
    stale = cli("thread", "rewind", thread, "--at", str(messages[-1]["seq"]), cwd=tmp_path)
    assert stale.returncode == 2 and "not on the current branch" in stale.stderr + stale.stdout, explain(stale)
    missing = cli("thread", "fork", "thread_nowhere", "--at", "0", cwd=tmp_path)
    assert missing.returncode == 2 and "Traceback" not in missing.stderr, explain(missing)
