"""Fixed instants and the units the tests count in, the database clock in the API's milliseconds, and a
thread's own clock moved on."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import TypeVar

from core.clock import compute_now, set_clock_offset

T = TypeVar("T")

# A fixed instant well in the future, so nothing the database clock does reaches it.
T0 = datetime(2030, 1, 1, tzinfo=UTC)
HOUR = timedelta(hours=1)
HOUR_MS = 3_600_000
# The largest instant the API accepts (2^47 milliseconds).
MAX_MS = 140737488355328


def at(hours: int = 0, minutes: int = 0) -> datetime:
    """`T0` plus `hours` and `minutes` (either may exceed a day's span or be negative)."""
    return T0 + timedelta(hours=hours, minutes=minutes)


def now_ms() -> int:
    """The database clock in the API's milliseconds, for scheduling operations."""
    return int(compute_now().timestamp() * 1000)


def with_clock_offset(offset: timedelta, action: Callable[[], T]) -> Callable[[], T]:
    """`action`, the calling connection's clock moved `offset` on first: for a thread's own connection."""

    def run() -> T:
        set_clock_offset(offset)
        return action()

    return run
