"""The capacity reconciler: a singleton pass that settles reservations, then rebuilds every pool's rollup.

Several replicas may run `rebuild_rollups --every`; a session-level
PostgreSQL advisory lock (`core.locks.ADVISORY_LOCK_KEYS["rollup-reconciler"]`)
lets only one of them run a pass at a time, and the others skip theirs.

Each pass first runs the reservations' time-driven work
(`reservations.services.reservations_reconcile`: due leases, ended
reservations, nodes that missed a delivery), then rebuilds, so the rebuilt
numbers already reflect what it released. That work manages its own
transactions; if it raises, the error is logged and the rebuild still runs.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import FrameType

from django.db import connection

from capacity.rollups import rollup_rebuild_all
from core.locks import ADVISORY_LOCK_KEYS
from core.ratelimit import rate_windows_prune
from reservations.services import reservations_reconcile

logger = logging.getLogger(__name__)

LOCK_NAME = "rollup-reconciler"


def _try_lock(key: int) -> bool:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_try_advisory_lock(%s)", [key])
        row = cursor.fetchone()
    return bool(row and row[0])


def _unlock(key: int) -> None:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_unlock(%s)", [key])


def reconcile_once(*, progress: Callable[[int, int], None] | None = None) -> bool:
    """One pass: hooks, then the rebuild of every pool. False when another replica holds the lock."""
    key = ADVISORY_LOCK_KEYS[LOCK_NAME]
    # A session lock, not a transaction lock: the pass spans many transactions
    # (one per hook and per batch of pools), and the lock must cover them all.
    if not _try_lock(key):
        return False
    try:
        try:
            reservations_reconcile()
            rate_windows_prune()
        except Exception:
            # The rebuild still runs: a failing lease or settlement pass must not freeze the numbers.
            logger.exception("the reconciler's reservation pass failed")
        rollup_rebuild_all(progress=progress)
    finally:
        _unlock(key)
    return True


@dataclass
class PassResult:
    ran: bool
    seconds: float


def reconcile_pass(*, progress: Callable[[int, int], None] | None = None) -> PassResult:
    """The loop body of `rebuild_rollups --every`: one pass, timed."""
    started = time.monotonic()
    ran = reconcile_once(progress=progress)
    return PassResult(ran=ran, seconds=time.monotonic() - started)


def reconcile_loop(
    *,
    every: float,
    stop: threading.Event,
    on_pass: Callable[[PassResult], None] | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> int:
    """Run passes every `every` seconds until `stop` is set; return how many passes ran.

    A stop that arrives during a pass lets that pass finish (each batch of
    pools is its own transaction, so there is nothing half-written to undo),
    then the loop returns instead of sleeping.
    """
    passes = 0
    while not stop.is_set():
        result = reconcile_pass(progress=progress)
        passes += 1
        if on_pass is not None:
            on_pass(result)
        stop.wait(max(0.0, every - result.seconds))
    return passes


def install_stop_handlers(stop: threading.Event) -> Callable[[], None]:
    """Make SIGTERM and SIGINT set `stop`; return a function that restores the old handlers."""

    def handle(signum: int, frame: FrameType | None) -> None:
        logger.info("reconciler: signal %s, stopping after this pass", signum)
        stop.set()

    previous = {sig: signal.signal(sig, handle) for sig in (signal.SIGTERM, signal.SIGINT)}

    def restore() -> None:
        for sig, handler in previous.items():
            signal.signal(sig, handler)

    return restore
