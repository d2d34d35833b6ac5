"""A transaction that PostgreSQL chose as a deadlock's victim runs again from the start.

PostgreSQL breaks a lock cycle by failing one of its transactions; the other
goes on. The victim's work is rolled back whole, so running it again is
safe, and it is what PostgreSQL's documentation asks of an application. Only
a call that owns its transaction is retried: inside a caller's transaction
the failure is the caller's to handle.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any, TypeVar, cast

from django.db import OperationalError, connection

from core.constants import DEADLOCK_DETECTED

logger = logging.getLogger(__name__)

F = TypeVar("F", bound=Callable[..., Any])

DEADLOCK_ATTEMPTS = 3


def lost_deadlock(exc: BaseException) -> bool:
    """Whether `exc` is PostgreSQL failing this transaction to break a lock cycle."""
    return isinstance(exc, OperationalError) and getattr(exc.__cause__, "sqlstate", None) == DEADLOCK_DETECTED


def deadlock_retried(func: F) -> F:
    """Run `func`, which opens its own transaction, again while it loses deadlocks (at most 3 runs)."""

    @functools.wraps(func)
    def run(*args: Any, **kwargs: Any) -> Any:
        attempts = 1 if connection.in_atomic_block else DEADLOCK_ATTEMPTS
        for attempt in range(1, attempts + 1):
            try:
                return func(*args, **kwargs)
            except OperationalError as exc:
                if not lost_deadlock(exc) or attempt == attempts:
                    raise
                logger.info("%s lost a deadlock; run %d of %d", func.__name__, attempt + 1, attempts)
        raise AssertionError("unreachable")  # pragma: no cover

    return cast(F, run)
