"""Django's PostgreSQL backend, with its health check and its cursors made cheaper.

The health check:

`CONN_HEALTH_CHECKS` makes Django send `SELECT 1` before the first query of
every request (and again before the delivery that runs after the response):
a round trip each, on a connection that was used a moment ago. A server that
closed the connection (restart, failover, `idle_session_timeout`, a pooler
dropping it) has written its goodbye to the socket first, an error message or
the end of the stream, so the idle socket is polled without waiting, and only
when something is readable does Django's own `SELECT 1` decide. A peer gone
silent without a packet is seen by neither check: `SELECT 1` would wait on
the same socket.
"""

from __future__ import annotations

import functools
import select
from typing import Any

from django.db.backends import utils
from django.db.backends.postgresql import base
from psycopg.pq import Format

from core.postgres.arrays import list_dumper_register
from core.postgres.timestamps import TIMESTAMPTZ_OID, timestamptz_loader_register

# Closed cursors kept per connection for the next `connection.cursor()`; more are closed for real.
SHELF_SIZE = 8


class _Shelved:
    """Mixin for the connection's cursor class: `close` puts the cursor back on its connection's shelf.

    A request sends a dozen statements, each through a new cursor, and a new
    psycopg cursor costs about 35 µs of CPU before its statement (its adapter
    map, its Django wrapper, its first look-ups of the statement's types). A
    closed cursor is emptied (`_reset`: no result, no rows, no query) and kept
    on a shelf that belongs to its connection, so it goes with the connection
    when Django reconnects; `DatabaseWrapper.create_cursor` takes it from there.
    A cursor is never on the shelf while in use, and closing it twice shelves it once.
    """

    _shelved = False

    def close(self) -> None:
        if self._shelved:
            return
        conn: Any = self._conn  # type: ignore[attr-defined]
        shelf: list[Any] | None = getattr(conn, "cursor_shelf", None)
        if shelf is None or conn.closed or self.closed or len(shelf) >= SHELF_SIZE:  # type: ignore[attr-defined]
            super().close()  # type: ignore[misc]
            return
        self._reset()  # type: ignore[attr-defined]
        self._last_query = None
        self._shelved = True
        shelf.append(self)


@functools.cache
def _shelved_class(cursor_class: type) -> type:
    """Django's cursor class for the connection, with `_Shelved` first (one class per base)."""
    return type(f"Shelved{cursor_class.__name__}", (_Shelved, cursor_class), {})


class _Direct:
    """Mixin for Django's cursor wrappers: what the service calls on every statement, as attributes.

    Django's `CursorWrapper` finds `close`, `fetchone`, `rowcount` and the
    rest in `__getattr__`, which Python calls only after the usual look-up
    failed, raising an `AttributeError` and formatting its message: a few
    microseconds, several times per statement. Here they are found at once,
    and do what Django's `__getattr__` gives: the psycopg cursor's own, with
    its fetches inside `wrap_database_errors`.
    """

    cursor: Any
    db: Any

    def close(self) -> None:
        self.cursor.close()

    def fetchone(self) -> Any:
        with self.db.wrap_database_errors:
            return self.cursor.fetchone()

    def fetchall(self) -> list[Any]:
        with self.db.wrap_database_errors:
            return self.cursor.fetchall()  # type: ignore[no-any-return]

    def fetchmany(self, *args: Any, **kwargs: Any) -> list[Any]:
        with self.db.wrap_database_errors:
            return self.cursor.fetchmany(*args, **kwargs)  # type: ignore[no-any-return]

    @property
    def rowcount(self) -> int:
        return self.cursor.rowcount  # type: ignore[no-any-return]

    @property
    def description(self) -> Any:
        return self.cursor.description


class CursorWrapper(_Direct, utils.CursorWrapper):
    pass


class CursorDebugWrapper(_Direct, utils.CursorDebugWrapper):
    pass


class DatabaseWrapper(base.DatabaseWrapper):
    def make_cursor(self, cursor: Any) -> CursorWrapper:
        return CursorWrapper(cursor, self)

    def make_debug_cursor(self, cursor: Any) -> CursorDebugWrapper:
        return CursorDebugWrapper(cursor, self)

    def get_connection_params(self) -> dict[str, Any]:
        params: dict[str, Any] = super().get_connection_params()
        params["cursor_factory"] = _shelved_class(params["cursor_factory"])
        return params

    def get_new_connection(self, conn_params: dict[str, Any]) -> Any:
        connection = super().get_new_connection(conn_params)
        connection.cursor_shelf = []
        list_dumper_register(connection)
        timestamptz_loader_register(connection, zone=self.timezone)
        return connection

    def create_cursor(self, name: str | None = None) -> Any:
        """A shelved cursor of this connection when there is one (never for a named, server-side cursor)."""
        shelf: list[Any] | None = getattr(self.connection, "cursor_shelf", None)
        if name is None and shelf:
            cursor = shelf.pop()
            cursor._shelved = False
            # Django gives a cursor a time-zone loader of its own where the connection's disagrees
            # with the current zone (a test's override): such a cursor is made new, as Django makes it.
            tzloader = self.connection.adapters.get_loader(TIMESTAMPTZ_OID, Format.TEXT)
            if self.timezone == tzloader.timezone:
                return cursor
            cursor.close()
        return super().create_cursor(name)

    def close_if_health_check_failed(self) -> None:
        """Django's check, skipped while the idle connection's socket has nothing to read."""
        checks = getattr(self, "health_check_enabled", False)  # set by Django's connect()
        if self.connection is None or not checks or getattr(self, "health_check_done", False):
            return
        if not self._socket_has_news():
            self.health_check_done = True
            return
        super().close_if_health_check_failed()

    def _socket_has_news(self) -> bool:
        """True where the server wrote to the idle connection: to say goodbye, or to notify."""
        try:
            fileno = self.connection.fileno()
        except Exception:
            return True  # closed or broken: let Django's check find out
        poller = select.poll()
        poller.register(fileno, select.POLLIN | select.POLLPRI | select.POLLERR | select.POLLHUP)
        return bool(poller.poll(0))
