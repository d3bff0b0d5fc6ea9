"""A MkDocs hook: the package's docstrings name things with Sphinx roles (:class:`~a.b.C`,
:func:`f`); mkdocstrings renders Markdown, where a role would show as typed. Each is shown as the
code it names (the last part only for a ``~`` target, as Sphinx does)."""

from __future__ import annotations

import re
from typing import Any

_ROLE = re.compile(r":(?:class|func|meth|mod|data|attr|exc|obj):<code>(~?)([^<]+)</code>")


def _shown(match: re.Match[str]) -> str:
    tilde, target = match.groups()
    return f"<code>{target.rsplit('.', 1)[-1] if tilde else target}</code>"


def on_page_content(html: str, **_: Any) -> str:
    return _ROLE.sub(_shown, html)
