"""History as JSON Lines: export a thread, a tenant or a time range, and read an export back.

The format (version :data:`FORMAT_VERSION`) is one JSON object per line:

- first a header: ``{"record": "header", "format": "threads-celery/history", "version": 1,
  "exported_at": ..., "scope": {...}}``;
- then, thread tree by thread tree (a root thread and the child threads of its agent tools),
  one line per row: ``{"record": "message", "root": ROOT_ID, "row": {...}}``, with every column
  of the row as the ledger holds it (timestamps in ISO 8601 UTC). The kinds, in this order:
  thread, message, event, run, tool_call (with its effect, status and outcome: result, error,
  resolution, approval), agent_tool_run, milestone, usage, grant, variable, hold;
- last an end line: ``{"record": "end", "threads": N, "rows": {kind: count}, "refused": [...]}``,
  whose counts let a reader tell a whole file from a cut one.

A secret variable's ``value`` (its ciphertext) is never exported: it is null, with
``"value_redacted": true``. Where the file goes is a local path or any fsspec URL
(``s3://bucket/key``, ``gs://...``; the ``archive`` extra installs fsspec and s3fs).
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any, Final
from urllib.parse import quote

from threads_celery.exceptions import ConfigError, HistoryFormatError

FORMAT: Final = "threads-celery/history"
FORMAT_VERSION: Final = 1
#: The record kinds of rows, in the order an export writes each tree's.
ROW_KINDS: Final = (
    "thread",
    "message",
    "event",
    "run",
    "tool_call",
    "agent_tool_run",
    "milestone",
    "usage",
    "grant",
    "variable",
    "hold",
    "branch",
    "deploy_mark",
)


def _jsonable(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.astimezone(UTC).isoformat()
    return value


def exported_row(kind: str, row: Mapping[str, Any]) -> dict[str, Any]:
    """A row as it leaves the ledger: JSON values, and no secret's ciphertext."""
    out = {name: _jsonable(value) for name, value in row.items()}
    if kind == "variable" and out.get("type") == "secret":
        out["value"] = None
        out["value_redacted"] = True
    return out


@dataclass(frozen=True)
class HistoryFile:
    """An export read back: its header, its row records (each ``{"record", "root", "row"}``) and
    its end line (None when the file was cut before it)."""

    header: dict[str, Any]
    records: tuple[dict[str, Any], ...]
    end: dict[str, Any] | None

    def rows(self, kind: str, *, root: str | None = None) -> list[dict[str, Any]]:
        """The rows of one kind (of one tree)."""
        return [r["row"] for r in self.records if r["record"] == kind and (root is None or r["root"] == root)]

    @property
    def roots(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(r["root"] for r in self.records))

    @property
    def complete(self) -> bool:
        """Whether the end line is there and its counts match the rows read."""
        if self.end is None:
            return False
        counts = Counter(r["record"] for r in self.records)
        return dict(counts) == {k: v for k, v in self.end.get("rows", {}).items() if v}


@dataclass
class ExportWriter:
    """Writes one export to a text stream, line by line, counting what it wrote."""

    stream: IO[str]
    counts: Counter[str] = field(default_factory=Counter)
    roots: list[str] = field(default_factory=list)
    refused: list[dict[str, str]] = field(default_factory=list)

    def header(self, scope: Mapping[str, Any], now: datetime) -> None:
        self._line(
            {"record": "header", "format": FORMAT, "version": FORMAT_VERSION,
             "exported_at": _jsonable(now), "scope": dict(scope)}
        )  # fmt: skip

    def tree(self, root: str, rows: Iterable[tuple[str, Mapping[str, Any]]]) -> None:
        self.roots.append(root)
        for kind, row in rows:
            self._line({"record": kind, "root": root, "row": exported_row(kind, row)})
            self.counts[kind] += 1

    def refuse(self, thread_id: str, reason: str) -> None:
        self.refused.append({"thread": thread_id, "reason": reason})

    def end(self) -> None:
        self._line(
            {"record": "end", "threads": len(self.roots), "rows": {k: self.counts[k] for k in ROW_KINDS},
             "refused": self.refused}
        )  # fmt: skip

    def _line(self, record: Mapping[str, Any]) -> None:
        self.stream.write(json.dumps(record, ensure_ascii=False, separators=(",", ":"), sort_keys=True))
        self.stream.write("\n")


def is_url(target: str) -> bool:
    """Whether ``target`` names an fsspec location rather than a local path."""
    return "://" in target and not target.startswith("file://")


@contextmanager
def open_text(target: str, mode: str, storage_options: Mapping[str, Any] | None = None) -> Iterator[IO[str]]:
    """``target`` opened as UTF-8 text: a local path (its folder made on write) or an fsspec URL."""
    if not is_url(target):
        path = Path(target.removeprefix("file://"))
        if "w" in mode:
            path.parent.mkdir(parents=True, exist_ok=True)
        with path.open(mode, encoding="utf-8") as stream:
            yield stream
        return
    try:
        import fsspec
    except ImportError:
        raise ConfigError(
            f"{target.split('://')[0]}:// needs fsspec (and its filesystem, e.g. s3fs): "
            "pip install 'threads-celery[archive]'"
        ) from None
    with fsspec.open(target, mode, encoding="utf-8", **dict(storage_options or {})) as stream:
        yield stream


def archive_location(archive_url: str, tenant: str, thread_id: str) -> str:
    """Where the archive of one thread tree lives: ``<archive_url>/<tenant>/<thread_id>.jsonl``
    (each part quoted, so an id is always one file name)."""
    return f"{archive_url.rstrip('/')}/{quote(tenant, safe='')}/{quote(thread_id, safe='')}.jsonl"


def parse_history(lines: Iterable[str], *, source: str = "the export") -> HistoryFile:
    """Read an export (or an archive) back; HistoryFormatError when it is not one this release reads."""
    header: dict[str, Any] | None = None
    records: list[dict[str, Any]] = []
    end: dict[str, Any] | None = None
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError as exc:
            raise HistoryFormatError(f"{source}, line {number}: not JSON ({exc})") from None
        if not isinstance(record, dict) or not isinstance(record.get("record"), str):
            raise HistoryFormatError(f"{source}, line {number}: not a history record")
        kind = record["record"]
        if header is None:
            if kind != "header" or record.get("format") != FORMAT:
                raise HistoryFormatError(f"{source}: the first line is not a {FORMAT} header")
            if record.get("version") != FORMAT_VERSION:
                raise HistoryFormatError(
                    f"{source}: format version {record.get('version')!r}; this release reads version {FORMAT_VERSION}"
                )
            header = record
        elif end is not None:
            raise HistoryFormatError(f"{source}, line {number}: a record after the end line")
        elif kind == "end":
            end = record
        elif kind in ROW_KINDS and isinstance(record.get("row"), dict):
            records.append(record)
        else:
            raise HistoryFormatError(f"{source}, line {number}: unknown record {kind!r}")
    if header is None:
        raise HistoryFormatError(f"{source} is empty")
    return HistoryFile(header, tuple(records), end)


def read_history(target: str, storage_options: Mapping[str, Any] | None = None) -> HistoryFile:
    """An export or archive file read back (a local path or an fsspec URL)."""
    try:
        with open_text(target, "r", storage_options) as stream:
            return parse_history(stream, source=target)
    except FileNotFoundError:
        raise HistoryFormatError(f"{target}: no such export or archive") from None


__all__ = [
    "FORMAT",
    "FORMAT_VERSION",
    "ROW_KINDS",
    "ExportWriter",
    "HistoryFile",
    "archive_location",
    "exported_row",
    "is_url",
    "open_text",
    "parse_history",
    "read_history",
]
