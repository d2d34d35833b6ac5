"""The bell of the agents' long polls: one LISTEN connection per process, rung per node.

An ASGI process (`Procfile`'s `agents`) answers `nodes/assignments` without a
thread or a database connection per waiting agent. Each waiting request holds an
`asyncio.Event` registered under its node; one connection per process LISTENs on
`NODE_CHANGES_CHANNEL`, and a NOTIFY (sent when a node's change commits,
`reservations.delivery.agent`) sets that node's events. The waiter then reads
its changes again. A lost connection wakes every waiter (each reads again, so
nothing is missed) and is opened again with a backoff.

The LISTEN connection goes to the database directly: a transaction pooler
(PgBouncer in transaction mode) cannot carry LISTEN.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import psycopg
from django.conf import settings
from django.db import connections

from reservations.delivery.agent import NODE_CHANGES_CHANNEL

logger = logging.getLogger(__name__)

# The keys of Django's connection parameters that psycopg's connect takes as they are.
_CONNECT_KEYS = ("dbname", "user", "password", "host", "port", "sslmode", "sslrootcert", "sslcert", "sslkey")
RECONNECT_SECONDS = 1.0


def _conninfo() -> dict[str, Any]:
    # Behind a transaction pooler, the `direct` alias (DATABASE_DIRECT_URL) reaches the primary
    # itself: in a cluster, HAProxy's leader frontend, so the LISTEN follows a failover.
    alias = "direct" if "direct" in settings.DATABASES else "default"
    params = connections[alias].get_connection_params()
    return {key: params[key] for key in _CONNECT_KEYS if params.get(key)}


class ChangeBell:
    """Waiters by node id, and the task that LISTENs for their changes."""

    def __init__(self) -> None:
        self._waiters: dict[str, set[asyncio.Event]] = {}
        self._task: asyncio.Task[None] | None = None
        self._ready: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    async def ready(self) -> None:
        """Start listening (once per event loop: one per ASGI worker) and return once LISTEN is in effect."""
        loop = asyncio.get_running_loop()
        if self._task is None or self._task.done() or self._loop is not loop:
            self._loop, self._ready = loop, asyncio.Event()
            self._task = loop.create_task(self._listen())
        assert self._ready is not None
        await self._ready.wait()

    def register(self, node_id: str) -> asyncio.Event:
        event = asyncio.Event()
        self._waiters.setdefault(node_id, set()).add(event)
        return event

    def unregister(self, node_id: str, event: asyncio.Event) -> None:
        waiting = self._waiters.get(node_id)
        if waiting is not None:
            waiting.discard(event)
            if not waiting:
                del self._waiters[node_id]

    @property
    def listening(self) -> bool:
        return self._ready is not None and self._ready.is_set()

    def waiting(self) -> int:
        return sum(len(events) for events in self._waiters.values())

    def _ring(self, node_id: str | None) -> None:
        """Wake the node's waiters; every waiter when `node_id` is None."""
        groups = self._waiters.values() if node_id is None else [self._waiters.get(node_id, set())]
        for events in groups:
            for event in events:
                event.set()

    async def _listen(self) -> None:
        while True:
            try:
                async with await psycopg.AsyncConnection.connect(autocommit=True, **_conninfo()) as conn:
                    await conn.execute(f"LISTEN {NODE_CHANGES_CHANNEL}")
                    assert self._ready is not None
                    self._ready.set()
                    # Whatever committed while no connection listened: every waiter reads again.
                    self._ring(None)
                    async for notify in conn.notifies():
                        self._ring(notify.payload)
            except (psycopg.Error, OSError) as exc:
                logger.warning("the agents' LISTEN connection failed (%s); listening again", exc)
                self._ring(None)
                await asyncio.sleep(RECONNECT_SECONDS)


# One per process: the ASGI server runs one event loop per worker process.
bell = ChangeBell()
