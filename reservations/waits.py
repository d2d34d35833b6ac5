"""Waiting for capacity (`wait.timeoutMs`) that costs no database connection and stays bounded.

A create that does not fit may wait up to 30 s for capacity to free up in its
pool: a release, a lease expiry, a settlement (quota and scalars given back),
a booking's end, or a node change that adds capacity (uncordon, untaint,
reconnect, health restored, new inventory). Each of those sends
`notify_release(pool_id=...)` (or the same `pg_notify` folded into one of its
statements) inside its transaction, delivered at commit. It must not hold a
database connection while it waits (110 waiters once exhausted
PostgreSQL's connections), and one tenant's waiters must not take every
worker thread from the others. So:

* **One listener per process.** A daemon thread keeps ONE connection of its own
  with `LISTEN capacity_released` and wakes the waiters of the pool named in
  each notification. A waiting request closes its own connection and blocks
  on an in-process event; each attempt opens a fresh one.
* **Bounded.** At most `CAPACITY_WAITERS_PER_TENANT` waiting creates per tenant
  across every process and replica (slots leased in the `reservations_waitslot`
  table, each expiring with its wait, so a killed worker frees its slot), and
  at most `CAPACITY_WAITERS_PER_PROCESS` in one process; beyond either, the
  create answers `TOO_MANY_WAITERS` (429) at once instead of waiting.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
from django.conf import settings
from django.db import connection

from core.errors import TooManyRequests
from core.postgres.conninfo import conninfo_of, session_alias

logger = logging.getLogger(__name__)

RELEASE_CHANNEL = "capacity_released"
# How long the listener waits before reconnecting after its connection failed.
LISTENER_RETRY_SECONDS = 1.0


class _Listener:
    """The process's one LISTEN connection, and the waiters it wakes, by pool."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._waiters: dict[str, set[threading.Event]] = defaultdict(set)
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()

    def _conninfo(self) -> str:
        return conninfo_of(session_alias())  # LISTEN needs a session

    def _run(self) -> None:
        reconnecting = False
        while True:
            try:
                with psycopg.connect(self._conninfo(), autocommit=True) as conn:
                    conn.execute(f"LISTEN {RELEASE_CHANNEL}")
                    self._ready.set()
                    if reconnecting:
                        # Whatever was released while no connection listened: every waiter looks again.
                        self._wake_all()
                    reconnecting = True
                    for notify in conn.notifies():
                        self._wake(notify.payload)
            except (psycopg.Error, OSError) as exc:
                reconnecting = True
                # The primary went away (a failover: the direct URL follows the new leader) or
                # restarted. Every waiter wakes and tries once more, so a release that committed
                # while nobody listened is not missed; nothing is lost but promptness.
                logger.warning("the capacity wait listener lost its connection (%s); reconnecting", exc)
                self._ready.clear()
                self._wake_all()
                time.sleep(LISTENER_RETRY_SECONDS)
            except Exception:
                reconnecting = True
                logger.exception("the capacity wait listener failed; reconnecting")
                self._ready.clear()
                self._wake_all()
                time.sleep(LISTENER_RETRY_SECONDS)

    def _wake(self, pool_id: str) -> None:
        with self._lock:
            for event in self._waiters.get(pool_id, ()):
                event.set()

    def _wake_all(self) -> None:
        with self._lock:
            for events in self._waiters.values():
                for event in events:
                    event.set()

    def start(self) -> None:
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="capacity-wait-listener", daemon=True)
                self._thread.start()
        # Listening must have begun before the caller's last attempt, or a release
        # that commits in between is missed; bounded so a dead database cannot hang us.
        self._ready.wait(timeout=5)

    @contextmanager
    def registered(self, pool_id: str) -> Iterator[threading.Event]:
        event = threading.Event()
        with self._lock:
            self._waiters[pool_id].add(event)
        try:
            yield event
        finally:
            with self._lock:
                self._waiters[pool_id].discard(event)
                if not self._waiters[pool_id]:
                    del self._waiters[pool_id]

    def waiting(self) -> int:
        with self._lock:
            return sum(len(events) for events in self._waiters.values())


LISTENER = _Listener()
_process_waiters = threading.BoundedSemaphore(1)  # replaced on first use, sized from the settings
_process_waiters_lock = threading.Lock()
_process_waiters_size = 0


def _process_semaphore() -> threading.BoundedSemaphore:
    global _process_waiters, _process_waiters_size
    size = int(settings.CAPACITY_WAITERS_PER_PROCESS)
    with _process_waiters_lock:
        if size != _process_waiters_size:
            _process_waiters, _process_waiters_size = threading.BoundedSemaphore(size), size
        return _process_waiters


# A slot is free when it has no row or its lease ran out; taking one is a single
# upsert, so two takers of one slot cannot both win (the loser's DO UPDATE finds
# the lease live and returns nothing, and it tries another slot).
_TAKE_SLOT_SQL = """
INSERT INTO reservations_waitslot AS w (tenant_id, slot, holder, expires_at)
VALUES (%(tenant)s, %(slot)s, %(holder)s, now() + make_interval(secs => %(seconds)s))
ON CONFLICT (tenant_id, slot) DO UPDATE
   SET holder = EXCLUDED.holder, expires_at = EXCLUDED.expires_at
 WHERE w.expires_at <= now()
RETURNING slot
"""


def _take_slot(*, tenant_id: str, seconds: float, holder: str) -> int | None:
    per_tenant = int(settings.CAPACITY_WAITERS_PER_TENANT)
    with connection.cursor() as cursor:
        for slot in range(per_tenant):
            cursor.execute(
                _TAKE_SLOT_SQL,
                {"tenant": tenant_id, "slot": slot, "holder": holder, "seconds": seconds + 1},
            )
            if cursor.fetchone() is not None:
                return slot
    return None


def _give_slot(*, tenant_id: str, slot: int, holder: str) -> None:
    with connection.cursor() as cursor:
        cursor.execute(
            "DELETE FROM reservations_waitslot WHERE tenant_id = %s AND slot = %s AND holder = %s",
            [tenant_id, slot, holder],
        )


@contextmanager
def wait_slot(*, tenant_id: str, seconds: float) -> Iterator[None]:
    """Hold one of the tenant's waiting slots (and the process's) for up to `seconds`, or raise 429."""
    semaphore = _process_semaphore()
    if not semaphore.acquire(blocking=False):
        raise TooManyRequests(
            "too many creates are waiting for capacity on this server; retry without wait.timeoutMs or later",
            retry_after=1,
        )
    holder = uuid.uuid4().hex
    slot: int | None = None
    try:
        slot = _take_slot(tenant_id=tenant_id, seconds=seconds, holder=holder)
        if slot is None:
            raise TooManyRequests(
                f"the tenant already has {settings.CAPACITY_WAITERS_PER_TENANT} creates waiting for capacity",
                retry_after=max(1, int(seconds)),
            )
        yield
    finally:
        if slot is not None:
            _give_slot(tenant_id=tenant_id, slot=slot, holder=holder)
        semaphore.release()


def wait_for_release(*, event: threading.Event, seconds: float) -> None:
    """Block until `event` (registered for the pool with `LISTENER`) is set, or `seconds` pass.

    The request's own connection goes back first; the next attempt opens a fresh one.
    """
    connection.close()
    event.wait(timeout=max(0.0, seconds))


def notify_release(*, pool_id: str) -> None:
    """Inside a transaction that frees capacity in the pool: its waiters wake when it commits."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_notify(%s, %s)", [RELEASE_CHANNEL, pool_id])
