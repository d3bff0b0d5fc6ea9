"""The side-effect ledger: what the chaos tools really did, kept OUTSIDE the threads store.

The store says what the runtime *believes* happened; this ledger says what the tools' effects
*actually* were, so the chaos tests can compare the two. It is an append-only text file (path in
``CHAOS_LEDGER``) shared by the test process and every worker process: one JSON line per event,
written with a single ``write`` on an ``O_APPEND`` descriptor and fsync'd, so a SIGKILL lands
either before or after a line, never inside one, and the file survives Redis and PostgreSQL
restarts (which is why it is not kept in either).

Two kinds of line:

* ``start``: a tool's ``execute`` began (one per execution, whatever the effect);
* ``effect``: the tool's outside-world effect happened (the thing that must not be repeated
  unless the effect class allows it).

Each line carries the effect key, the tool, the test's ``ref`` (which run it belongs to), the
attempt the runtime reported, the time and the pid of the process that wrote it.
"""

from __future__ import annotations

import json
import os
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from pathlib import Path

from tests.support.waiting import eventually

ENV_VAR = "CHAOS_LEDGER"


@dataclass(frozen=True, slots=True)
class Entry:
    kind: str  # "start" or "effect"
    effect_key: str
    tool: str
    ref: str
    attempt: int
    at: float  # time.time() when written
    pid: int


class Ledger:
    """One ledger file. Cheap to construct; every read re-reads the file."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)

    @classmethod
    def from_env(cls) -> Ledger:
        path = os.environ.get(ENV_VAR)
        if not path:
            raise RuntimeError(f"{ENV_VAR} is not set: the chaos tools do not know where to record effects")
        return cls(path)

    # -- writing (worker processes) -------------------------------------------------------------

    def record(self, kind: str, *, effect_key: str, tool: str, ref: str, attempt: int) -> Entry:
        entry = Entry(kind, effect_key, tool, ref, attempt, time.time(), os.getpid())
        line = (json.dumps(asdict(entry)) + "\n").encode()
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line)  # one write: a kill lands before or after the line, never inside it
            os.fsync(fd)
        finally:
            os.close(fd)
        return entry

    # -- reading ------------------------------------------------------------------------------

    def entries(self) -> list[Entry]:
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return []
        out: list[Entry] = []
        for line in raw.decode().splitlines():
            if not line.strip():
                continue
            out.append(Entry(**json.loads(line)))
        return out

    def effects(self, effect_key: str | None = None) -> list[Entry]:
        return [e for e in self.entries() if e.kind == "effect" and (effect_key is None or e.effect_key == effect_key)]

    def starts(self, effect_key: str | None = None) -> list[Entry]:
        return [e for e in self.entries() if e.kind == "start" and (effect_key is None or e.effect_key == effect_key)]

    def effect_count(self, effect_key: str) -> int:
        return len(self.effects(effect_key))

    def effect_counts(self, keys: Iterable[str] | None = None) -> Counter[str]:
        counts = Counter(e.effect_key for e in self.effects())
        if keys is None:
            return counts
        wanted = set(keys)
        return Counter({k: v for k, v in counts.items() if k in wanted})

    def wait_for(self, predicate: Callable[[list[Entry]], Entry | None], *, timeout: float, what: str) -> Entry:
        """Poll the file until ``predicate(entries)`` returns an entry; AssertionError after ``timeout``."""
        return eventually(
            lambda: predicate(self.entries()), timeout=timeout, what=f"the ledger showing {what}", interval=0.02
        )

    def wait_for_line(self, kind: str, effect_key: str, *, timeout: float = 30.0, nth: int = 1) -> Entry:
        """The ``nth`` line of ``kind`` for ``effect_key``, once it is written."""

        def pick(entries: list[Entry]) -> Entry | None:
            matching = [e for e in entries if e.kind == kind and e.effect_key == effect_key]
            return matching[nth - 1] if len(matching) >= nth else None

        return self.wait_for(pick, timeout=timeout, what=f"{kind} #{nth} of {effect_key}")
