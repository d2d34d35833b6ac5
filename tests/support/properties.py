"""Property tests: their hypothesis settings, the check every text parser answers to, and a transaction
always rolled back, so that each generated example starts from the same database."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TypeVar

import pytest
from django.db import transaction
from hypothesis import given, settings
from hypothesis import strategies as st

T = TypeVar("T")
Test = Callable[..., None]

# No deadline: a busy machine must not turn a slow example into a failure.
no_deadline = settings(deadline=None)


def on_arbitrary_and_near_miss_text(
    arbitrary: st.SearchStrategy[str], near_miss: st.SearchStrategy[str]
) -> Callable[[Test], Test]:
    """Run a property test as two cases: on arbitrary text, and on text near the parser's grammar.

    The test takes `texts` (the case's strategy) and hypothesis's `data`, and draws its
    text with `data.draw(texts)`.
    """

    def decorate(test: Test) -> Test:
        cases = [pytest.param(arbitrary, id="arbitrary-text"), pytest.param(near_miss, id="near-miss-text")]
        return pytest.mark.parametrize("texts", cases)(no_deadline(given(data=st.data())(test)))

    return decorate


def parsed_or_none(parse: Callable[[str], T], text: str, error: type[Exception]) -> T | None:
    """What `parse` makes of `text`, or None when it refuses the text with its own `error`.

    Anything else it raises goes up and fails the test.
    """
    try:
        return parse(text)
    except error:
        return None


class _Rollback(Exception):
    """Raised at the end of `rolled_back` to undo its transaction."""


@contextmanager
def rolled_back() -> Iterator[None]:
    """A transaction undone at its end, whatever it wrote; what the body raises goes up as raised."""
    try:
        with transaction.atomic():
            yield
            raise _Rollback
    except _Rollback:
        pass
