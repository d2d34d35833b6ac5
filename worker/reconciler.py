"""The one-off pass of `rebuild_rollups`: the reservations' time-driven work, then every pool's rebuild.

The always-on loop is the worker (`worker.loop`, `manage.py worker`); this
is what an operator runs by hand to bring everything up to date at once. It
holds the rebuild's advisory lock (`core.locks.ADVISORY_LOCK_KEYS["rollup-reconciler"]`),
the one the worker's periodic rebuild takes too, so one rebuild runs at a
time and a second caller skips instead of waiting.

It first runs the reservations' time-driven work
(`reservations.lifecycle.deadlines.reservations_reconcile`: due leases, ended
reservations, due deliveries) and the rate-window prune, then rebuilds, so
the rebuilt numbers already reflect what it released. That work manages its
own transactions; if it raises, the error is logged and the rebuild still runs.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from django.db import connection

from core.locks import ADVISORY_LOCK_KEYS
from core.ratelimit import rate_windows_prune
from reservations.lifecycle.deadlines import reservations_reconcile
from reservations.rollups.recount import rollup_rebuild_all

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
    """One pass: hooks, then the rebuild of every pool. False when another rebuild holds the lock."""
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
