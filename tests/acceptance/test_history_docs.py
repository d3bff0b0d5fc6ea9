"""The example of docs/history.md, saved as a user saves it and run with ``python``, embedded."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.support.docs_blocks import file_blocks

PAGE = Path(__file__).resolve().parents[2] / "docs" / "history.md"


def test_the_history_page_example_runs_as_pasted(tmp_path: Path) -> None:
    [block] = file_blocks("branches.py", PAGE)
    (tmp_path / "branches.py").write_text(block, encoding="utf-8")
    done = subprocess.run(
        [sys.executable, "branches.py"], cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    current, everything, branches, fork = done.stdout.strip().splitlines()
    assert current == "['Book a table for two', 'Two seats at the bar, at nine.']"
    assert (
        everything
        == "['Book a table for two', 'A table for two at eight.', 'Book a table for two', 'Two seats at the bar, at nine.']"
    )
    assert branches == "[('regenerate', 0)]"  # the regenerate left messages 0 and 1 behind
    assert fork == "['Book a table for two', 'Make it for four', 'A table for four at eight.']"
