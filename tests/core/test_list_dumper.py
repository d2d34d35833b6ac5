"""The connection's list dumper sends what psycopg's own would send (`core.postgres.arrays`).

It recognises flat lists of `str` or `int`, keeps the dumper psycopg built for
them on the connection and writes their text in one join. Whatever it sends
must be byte for byte psycopg's: the same text, the same type oid. And what
PostgreSQL reads back must be the list sent.
"""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
from django.db import connection
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from psycopg.adapt import AdaptersMap, PyFormat, Transformer

from core.postgres.arrays import ListDumper

pytestmark = pytest.mark.django_db

# Ordinary text, the words psycopg quotes (empty, NULL in any case), and ordinary text with one of
# the characters psycopg treats apart (quotes, braces, the delimiter, backslash, ASCII and Unicode
# white space, other non-ASCII text) inside: one at a time, so that each is what decides.
_PLAIN = st.text(st.sampled_from(list("ab-_.:0Nul")), max_size=6)
_APART = st.sampled_from([*',"{}\\ \t\n\x0b\x0c\r', "\u1680", "\u2003", "\u3000", "é", "ß"])
_TEXT = (
    _PLAIN
    | st.sampled_from(["", "NULL", "null", "Null", "nul", "nulls"])
    | st.builds(lambda head, apart, tail: head + apart + tail, _PLAIN, _APART, _PLAIN)
)
_INT = st.integers(min_value=-(2**70), max_value=2**70) | st.integers(min_value=-40000, max_value=40000)
_LISTS = (
    st.lists(_TEXT, max_size=6)
    | st.lists(_INT, max_size=6)
    | st.lists(st.one_of(_TEXT, st.none()), max_size=5)
    | st.lists(st.one_of(_INT, st.none()), max_size=5)
    | st.lists(st.lists(_TEXT, min_size=1, max_size=3), min_size=1, max_size=3)
    | st.lists(st.booleans(), min_size=1, max_size=4)
)


def _raw() -> Any:
    connection.ensure_connection()
    return connection.connection


def _dumped(context: Any, value: list[Any]) -> tuple[bytes | None, int]:
    """What a statement with `value` as its one parameter would send: (text, type oid)."""
    transformer = Transformer(context)
    params = transformer.dump_sequence([value], [PyFormat.AUTO])
    sent, types = params[0], transformer.types
    assert types is not None
    return (bytes(sent) if sent is not None else None), types[0]


def _psycopg_own() -> AdaptersMap:
    return AdaptersMap(psycopg.adapters)


def test_the_service_connection_sends_lists_through_the_kept_dumper() -> None:
    raw = _raw()
    assert raw.adapters.get_dumper(list, PyFormat.AUTO) is ListDumper
    raw.list_dumpers.clear()  # as on a new connection, whatever earlier tests sent on this one
    with connection.cursor() as cursor:
        cursor.execute("SELECT %s::text[], %s::bigint[]", [["a", "b"], [1, 2]])
        assert cursor.fetchone() == (["a", "b"], [1, 2])
    kept = dict(raw.list_dumpers)
    assert len(kept) == 2
    with connection.cursor() as cursor:
        cursor.execute("SELECT %s::text[], %s::bigint[]", [["c"], [3]])
        assert cursor.fetchone() == (["c"], [3])
    # The second statement used the dumpers the first one built: none was made again.
    assert raw.list_dumpers == kept


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(value=_LISTS)
def test_a_list_is_sent_as_psycopg_would_send_it(value: list[Any]) -> None:
    raw = _raw()
    assert _dumped(raw, value) == _dumped(_psycopg_own(), value)
    # And twice on the same connection: the kept dumper answers the second time.
    assert _dumped(raw, value) == _dumped(_psycopg_own(), value)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(texts=st.lists(_TEXT, max_size=6), numbers=st.lists(st.integers(-(2**62), 2**62), max_size=6))
def test_postgresql_reads_back_the_lists_sent(texts: list[str], numbers: list[int]) -> None:
    with connection.cursor() as cursor:
        cursor.execute("SELECT %s::text[], %s::bigint[]", [texts, numbers])
        assert cursor.fetchone() == (texts, numbers)


def test_widths_of_integers_are_kept_apart() -> None:
    """A list of small integers and one of large ones are different arrays (int2 and int8)."""
    raw = _raw()
    small, large = _dumped(raw, [1, 2]), _dumped(raw, [1, 2**40])
    assert small[1] != large[1]
    assert (small, large) == (_dumped(_psycopg_own(), [1, 2]), _dumped(_psycopg_own(), [1, 2**40]))
    # And in the other order on a fresh kept store: the first width does not decide the second.
    raw.list_dumpers.clear()
    assert _dumped(raw, [1, 2**40]) == large and _dumped(raw, [1, 2]) == small


def test_a_nul_in_a_string_is_refused_as_psycopg_refuses_it() -> None:
    with pytest.raises(psycopg.DataError):
        _dumped(_raw(), ["a", "b\x00"])
