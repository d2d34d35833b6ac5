"""Listening to PostgreSQL notifications from a test, on a connection of its own, as the worker does."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
from django.db import connection

from tests.support.threads import JOIN_SECONDS


class Listener:
    """A connection of its own LISTENing on a channel; payloads in arrival order."""

    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self.conn = conn
        self.pending: list[str] = []

    def next(self) -> str:
        if not self.pending:
            # Several notifications may come in one read: keep them all.
            self.pending = [n.payload for n in self.conn.notifies(timeout=JOIN_SECONDS, stop_after=1)]
        assert self.pending, "no notification arrived"
        return self.pending.pop(0)

    def none(self) -> bool:
        """True when nothing arrives for a moment (and nothing is pending)."""
        if self.pending:
            return False
        self.pending = [n.payload for n in self.conn.notifies(timeout=0.2, stop_after=1)]
        return not self.pending


@contextmanager
def listening(channel: str) -> Iterator[Listener]:
    params = dict(connection.get_connection_params())
    for name in ("cursor_factory", "context", "prepare_threshold"):
        params.pop(name, None)
    with psycopg.connect(**params, autocommit=True) as conn:
        conn.execute(f"LISTEN {channel}")
        yield Listener(conn)
