"""The strict JSON reader of every body and fleet file: what it refuses, and that it refuses only that."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from core.errors import MAX_ERROR_DETAILS, InvalidInput
from core.json_input import MAX_INT_DIGITS, json_loads_strict, text_problem

# Any text, NUL and lone surrogates included (Hypothesis's default alphabet excludes surrogates).
texts = st.text(st.characters(codec=None, exclude_categories=()), max_size=8) | st.sampled_from(
    ["\x00", "\ud800", "a\udfff", "\ud83d\ude00", "ok"]
)
values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | texts,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(texts, inner, max_size=4),
    max_leaves=20,
)


def has_bad_text(value: Any) -> bool:
    if isinstance(value, str):
        return text_problem(value) is not None
    if isinstance(value, dict):
        return any(has_bad_text(k) or has_bad_text(v) for k, v in value.items())
    if isinstance(value, list):
        return any(has_bad_text(v) for v in value)
    return False


@settings(max_examples=500, deadline=None)
@given(values, st.booleans())
def test_a_document_is_read_back_exactly_or_refused_for_a_bad_string(value: Any, ascii_only: bool) -> None:
    raw = json.dumps(value, ensure_ascii=ascii_only)
    encoded = raw.encode("utf-8", errors="surrogatepass")
    meaning = json.loads(raw)  # what Python's own reader makes of it (`"\\ud800\\udc00"` is one character)
    try:
        encoded.decode("utf-8")
    except UnicodeDecodeError:
        utf8 = False
    else:
        utf8 = True
    try:
        parsed = json_loads_strict(encoded)
    except InvalidInput as exc:
        # Refused only for what the rules name: a bad string, or bytes that are not UTF-8.
        assert has_bad_text(meaning) or not utf8, (value, exc.details)
        assert 0 < len(exc.details) <= MAX_ERROR_DETAILS + 1
        json.dumps(exc.details, ensure_ascii=False).encode("utf-8")
        return
    assert utf8 and not has_bad_text(meaning)
    assert parsed == meaning


@pytest.mark.parametrize(
    ("raw", "field", "message"),
    [
        (b'{"a": {"b": 1, "b": 2}}', "a.b", "duplicate key"),
        (b'{"a": [1, "\\u0000"]}', "a[1]", "NUL"),
        (b'{"a": "\\\\u0000"}', None, None),  # an escaped backslash, then the text u0000: a fine string
        (b'{"a": "\\ud83d\\ude00"}', None, None),  # a surrogate pair is one character
        (b'{"a": "\\ude00\\ud83d"}', "a", "surrogate"),  # the pair the wrong way round is two lone halves
        (b'{"a": ' + b"1" * (MAX_INT_DIGITS + 1) + b"}", "a", "integer too large"),
        (b'{"a": -' + b"1" * MAX_INT_DIGITS + b"}", None, None),
        (b'{"a": 1e400}', "a", "number out of range"),
        (b'{"a": -Infinity}', "body", "not valid JSON"),
        (b"\xef\xbb\xbf{}", "body", "not valid JSON"),
        (b'{"a": "\xed\xa0\x80"}', "body", "not valid UTF-8"),
    ],
)
def test_what_the_reader_refuses_and_names(raw: bytes, field: str | None, message: str | None) -> None:
    if field is None:
        json_loads_strict(raw)
        return
    with pytest.raises(InvalidInput) as caught:
        json_loads_strict(raw)
    assert caught.value.details[0]["field"] == field and message in caught.value.details[0]["message"]


def test_thousands_of_problems_are_counted_not_listed() -> None:
    raw = json.dumps({f"k{i}": "\x00" for i in range(5_000)}).encode()
    with pytest.raises(InvalidInput) as caught:
        json_loads_strict(raw)
    details = caught.value.details
    assert len(details) == MAX_ERROR_DETAILS + 1
    assert details[-1] == {"field": "body", "message": f"and {5_000 - MAX_ERROR_DETAILS} more"}
