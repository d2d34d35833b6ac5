"""What reaches the database server, counted at the driver: every psycopg cursor's `execute`.

Django's own counting (`CaptureQueriesContext`, `execute_wrapper`) sees only
the statements sent through its cursor wrapper; its health check's `SELECT 1`
goes through psycopg's cursor directly and would not be counted.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from unittest import mock

import psycopg


@contextmanager
def sent_to_the_server() -> Iterator[list[str]]:
    """Every statement any psycopg cursor of this process executes while inside, as text."""
    sent: list[str] = []
    original = psycopg.Cursor.execute

    def execute(self: psycopg.Cursor[Any], query: Any, params: Any = None, **kwargs: Any) -> Any:
        sent.append(query if isinstance(query, str) else query.as_string(self))
        return original(self, query, params, **kwargs)

    with mock.patch.object(psycopg.Cursor, "execute", execute):
        yield sent
