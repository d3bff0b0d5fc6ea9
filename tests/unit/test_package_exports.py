"""The package's public names: ``__all__`` is what the lazy exports give, and the package is typed."""

from __future__ import annotations

from pathlib import Path

import threads_celery


def test_all_lists_exactly_the_lazily_exported_names() -> None:
    # __all__ is written out for type checkers and linters; it must not drift from _EXPORTS.
    assert sorted(threads_celery.__all__) == sorted(threads_celery._EXPORTS)


def test_every_exported_name_resolves() -> None:
    for name in threads_celery.__all__:
        assert getattr(threads_celery, name) is not None, name


def test_the_package_declares_itself_typed() -> None:
    # PEP 561: without py.typed, users' type checkers ignore the package's annotations.
    assert (Path(threads_celery.__file__).parent / "py.typed").is_file()
