"""Django's PostgreSQL backend, with one method replaced.

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

import select

from django.db.backends.postgresql import base


class DatabaseWrapper(base.DatabaseWrapper):
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
