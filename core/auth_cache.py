"""The process's memory of signed-in tokens: at most a second old, forgotten at once on any change.

Authentication is a statement on every request (`core.authentication`); most
requests of a busy client come within a second of its last one. A token's row,
its principal and bindings, once read, are kept here for `AUTH_CACHE_SECONDS`
(1 s; 0 turns the memory off) and answered from memory.

Revocation stays immediate, across every replica: a trigger (core migration
0006) sends `NOTIFY auth_changed` when a token is revoked or its expiry moves, and
on any change of a principal or a role binding; each process LISTENs on its
own connection and forgets everything when it hears one. Writes made through
this process's ORM forget at once too (`post_save`, `post_delete`), without
waiting for the notification. While the listener is not connected (it has not
started yet, or lost its connection) nothing is remembered, so a missed
notification can never keep a revoked token alive. A token that expires
within the memory's lifetime is not remembered either (`cacheable` in the
authentication's query, by the database clock).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import Any

import psycopg
from django.conf import settings

from core.postgres.conninfo import conninfo_of, session_alias

logger = logging.getLogger(__name__)

AUTH_CHANNEL = "auth_changed"
# How long the listener waits before reconnecting after its connection failed.
RETRY_SECONDS = 1.0

Row = tuple[Any, ...]


class _Memory:
    """Digest → (when read, monotonic; the authentication's row), valid while the listener listens."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._rows: dict[str, tuple[float, Row]] = {}
        # Bumped by every `forget`: a row read before a change is not remembered after it.
        self.generation = 0
        self._listening = threading.Event()
        self._thread: threading.Thread | None = None
        self._pid = 0

    def seconds(self) -> float:
        return float(getattr(settings, "AUTH_CACHE_SECONDS", 1.0))

    def get(self, digest: str) -> Row | None:
        """The remembered row, if read less than the lifetime ago and nothing changed since."""
        if self.seconds() <= 0:
            return None
        self._start()
        if not self._listening.is_set():
            return None
        with self._lock:
            entry = self._rows.get(digest)
        if entry is None or time.monotonic() - entry[0] >= self.seconds():
            return None
        return entry[1]

    def put(self, digest: str, row: Row, *, generation: int) -> None:
        """Remember a row read when `generation` was current (`self.generation` before the read)."""
        if self.seconds() <= 0 or not self._listening.is_set():
            return
        with self._lock:
            if generation != self.generation:
                return  # something changed while it was read: it may already be out of date
            if len(self._rows) > 10_000:  # a flood of distinct tokens: start over rather than grow
                self._rows.clear()
            self._rows[digest] = (time.monotonic(), row)

    def forget(self) -> None:
        with self._lock:
            self._rows.clear()
            self.generation += 1

    def start(self) -> None:
        self._start()

    def listening(self, *, timeout: float) -> bool:
        return self._listening.wait(timeout)

    def _start(self) -> None:
        # Per process: a forked server worker starts its own listener.
        if self._pid == os.getpid() and self._thread is not None and self._thread.is_alive():
            return
        with self._lock:
            if self._pid == os.getpid() and self._thread is not None and self._thread.is_alive():
                return
            self._pid = os.getpid()
            self._listening.clear()
            self._rows.clear()
            self._thread = threading.Thread(target=self._run, name="auth-cache-listener", daemon=True)
            self._thread.start()

    def _conninfo(self) -> str:
        return conninfo_of(session_alias())  # LISTEN needs a session

    def _run(self) -> None:
        failures = 0
        while True:
            try:
                with psycopg.connect(self._conninfo(), autocommit=True) as conn:
                    conn.execute(f"LISTEN {AUTH_CHANNEL}")
                    self.forget()  # whatever changed while nobody listened
                    self._listening.set()
                    failures = 0
                    for _ in conn.notifies():
                        self.forget()
            except Exception as exc:  # any failure only turns the memory off
                # Said once per outage, not once per retry.
                log = logger.warning if failures == 0 else logger.debug
                log("the auth cache's listener lost its connection (%s); remembering nothing", exc)
                failures += 1
            self._listening.clear()
            self.forget()
            time.sleep(RETRY_SECONDS)


MEMORY = _Memory()


def auth_cache_start(*, timeout: float = 5.0) -> bool:
    """Start this process's listener now and wait (at most `timeout`) until it listens; whether it does.

    Without it the memory starts on the first authentication and remembers
    from the first request after its connection is up.
    """
    MEMORY.start()
    return MEMORY.listening(timeout=timeout)


def auth_cache_forget(**_: Any) -> None:
    """Forget every remembered token (a signal receiver, and called after a revocation)."""
    MEMORY.forget()
