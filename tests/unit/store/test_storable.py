"""The ledger's JSON serializer: storable text only, and the same JSON as cleaning first."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from threads_celery.records import storable
from threads_celery.store.storable import clean_parameters, dumps

# Text drawn with NUL, lone surrogates and characters beyond the BMP among the rest.
TEXT = st.lists(st.one_of(st.characters(), st.sampled_from(["\x00", "\ud800", "\udfff", "😀", "\\u0000"]))).map("".join)
JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | TEXT,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(TEXT, inner, max_size=4),
    max_leaves=12,
)


@given(JSON)
def test_dumps_writes_what_cleaning_first_writes(value: object) -> None:
    assert dumps(value) == json.dumps(storable(value))


@given(JSON)
def test_what_dumps_writes_reads_back_without_nul_or_surrogates(value: object) -> None:
    text = json.dumps(json.loads(dumps(value)), ensure_ascii=False)
    assert "\x00" not in text
    assert not any(0xD800 <= ord(c) <= 0xDFFF for c in text)


def test_the_replacement_is_u_fffd_and_a_real_emoji_is_kept() -> None:
    assert json.loads(dumps({"a\x00": ["\ud800", "😀"]})) == {"a\ufffd": ["\ufffd", "😀"]}


def test_parameters_are_cleaned_however_nested() -> None:
    assert clean_parameters({"a": ("x\x00", ["\udc00", 3]), "b": None}) == {"a": ("x\ufffd", ["\ufffd", 3]), "b": None}
