"""Every ``type: ignore`` in the package names its error code and says why (issue 10: typed)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("threads_celery", "tasks", "beat")
IGNORE = re.compile(r"#\s*type:\s*ignore(?P<codes>\[[^\]]*\])?(?P<after>.*)$")


@dataclass(frozen=True)
class Ignore:
    where: str
    codes: str | None
    after: str  # the rest of the line after the ignore
    above: str  # the line above (above its decorators, for a def)


def _ignores() -> list[Ignore]:
    found = []
    for package in PACKAGES:
        for path in sorted((REPO_ROOT / package).rglob("*.py")):
            lines = path.read_text(encoding="utf-8").splitlines()
            for number, line in enumerate(lines, start=1):
                match = IGNORE.search(line)
                if match is not None:
                    # The line above, skipping the decorators of a decorated def.
                    above = number - 2
                    while above > 0 and lines[above].strip().startswith("@"):
                        above -= 1
                    found.append(
                        Ignore(
                            where=f"{path.relative_to(REPO_ROOT)}:{number}",
                            codes=match.group("codes"),
                            after=match.group("after").strip(),
                            above=lines[above].strip() if above >= 0 else "",
                        )
                    )
    return found


def test_every_type_ignore_names_an_error_code() -> None:
    bare = [i.where for i in _ignores() if not i.codes]
    assert bare == [], "a type: ignore must name the error it silences, e.g. type: ignore[arg-type]"


def test_every_type_ignore_says_why() -> None:
    # The reason is a comment after the ignore or a comment line just above it.
    unexplained = [i.where for i in _ignores() if not i.after.startswith("#") and not i.above.startswith("#")]
    assert unexplained == [], "each type: ignore needs a comment (after it or on the line above) saying why"
