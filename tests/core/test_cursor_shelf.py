"""Closed cursors are kept on their connection for the next `connection.cursor()` (`core.postgres.base`).

What a cursor on the shelf must never do: be handed to two users at once, carry
a statement's result, row or error to the next user, outlive its connection.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.db import DatabaseError, connection, transaction

from core.postgres.base import SHELF_SIZE
from inventory.models import Pool

pytestmark = pytest.mark.django_db


def _psycopg(cursor: Any) -> Any:
    return cursor.cursor  # Django's wrapper around psycopg's cursor


def _shelf() -> list[Any]:
    connection.ensure_connection()
    shelf: list[Any] = connection.connection.cursor_shelf
    return shelf


def test_a_closed_cursor_is_the_next_one_handed_out_and_starts_empty() -> None:
    with connection.cursor() as first:
        first.execute("SELECT 1, 'one'")
        used = _psycopg(first)
    assert _shelf()[-1] is used
    with connection.cursor() as second:
        assert _psycopg(second) is used
        assert second.description is None and second.rowcount == -1
        second.execute("SELECT 2")
        assert second.fetchall() == [(2,)]


def test_cursors_in_use_at_once_are_different_and_keep_their_own_rows() -> None:
    with connection.cursor() as outer:
        outer.execute("SELECT generate_series(1, 3)")
        assert outer.fetchone() == (1,)
        with connection.cursor() as inner:
            assert _psycopg(inner) is not _psycopg(outer)
            inner.execute("SELECT 'inner'")
            assert inner.fetchall() == [("inner",)]
        assert outer.fetchall() == [(2,), (3,)]


def test_a_cursor_closed_twice_is_shelved_once() -> None:
    cursor = connection.cursor()
    shelved = len(_shelf())
    cursor.close()
    cursor.close()
    assert len(_shelf()) == shelved + 1
    with connection.cursor() as a, connection.cursor() as b:
        assert _psycopg(a) is not _psycopg(b)


def test_the_shelf_holds_at_most_its_size() -> None:
    cursors = [connection.cursor() for _ in range(SHELF_SIZE + 3)]
    for cursor in cursors:
        cursor.close()
    assert len(_shelf()) == SHELF_SIZE
    assert sum(_psycopg(c).closed for c in cursors) == 3  # the rest closed for real


def test_a_cursor_whose_statement_failed_serves_the_next_statement() -> None:
    with transaction.atomic():
        with pytest.raises(DatabaseError), transaction.atomic(), connection.cursor() as cursor:
            cursor.execute("SELECT 1 / 0")
        with connection.cursor() as again:
            again.execute("SELECT 'after'")
            assert again.fetchall() == [("after",)]


@pytest.mark.django_db(transaction=True)
def test_a_new_connection_starts_with_an_empty_shelf() -> None:
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
        old = _psycopg(cursor)
    old_connection = connection.connection
    connection.close()
    shelf = _shelf()  # reconnected: its own shelf (the connection's set-up may have shelved a cursor)
    assert connection.connection is not old_connection
    assert old not in shelf and all(cursor.connection is connection.connection for cursor in shelf)
    with connection.cursor() as cursor:
        assert _psycopg(cursor) is not old
        cursor.execute("SELECT 1")
        assert cursor.fetchone() == (1,)


def test_a_server_side_cursor_is_never_taken_from_the_shelf() -> None:
    with connection.cursor():
        pass
    with transaction.atomic():
        shelved = list(_shelf())
        named = connection.chunked_cursor()  # a named cursor, as `QuerySet.iterator()` takes
        assert _psycopg(named) not in shelved and _shelf() == shelved
        named.execute("SELECT generate_series(1, 3)")
        assert len(named.fetchall()) == 3
        named.close()
    assert _shelf() == shelved  # closed for real, not shelved
    assert list(Pool.objects.values_list("id", flat=True).iterator(chunk_size=2)) == list(
        Pool.objects.values_list("id", flat=True)
    )
