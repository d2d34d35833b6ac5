"""`timestamptz` values read by psycopg's own loader (its C one) where Django reads UTC.

Django gives every connection a loader of its own for `timestamptz`: a
subclass of psycopg's pure-Python loader, which matches each value against a
regular expression, builds the datetime, then replaces its zone with the
database's (`timezone.utc` here). A create and its release read a dozen of
them (the bookings' ranges, the reservation's times), about 4 µs each.

Where Django's zone is UTC, the connection's `TimeZone` is UTC too (Django
sets it so when it connects), and psycopg's own loader gives the very same
value: an aware datetime in `timezone.utc`. So the connection is given that
loader, behind a thin class that carries the `timezone` Django's cursor code
compares with its own (psycopg's C loader cannot be subclassed). Any other zone
keeps Django's loader.
"""

from __future__ import annotations

import datetime
from typing import Any

import psycopg
from psycopg.adapt import Loader
from psycopg.pq import Format

TIMESTAMPTZ_OID = psycopg.adapters.types["timestamptz"].oid

# psycopg's default loader for the type: the C one where psycopg's binary package is installed.
_PSYCOPG_LOADER: Any = psycopg.adapters.get_loader(TIMESTAMPTZ_OID, Format.TEXT)


class UtcTimestamptzLoader(Loader):
    """psycopg's own `timestamptz` loader, with the `timezone` attribute Django's cursors look at."""

    timezone = datetime.UTC

    def __init__(self, oid: int, context: Any = None) -> None:
        super().__init__(oid, context)
        self._psycopgs = _PSYCOPG_LOADER(oid, context)
        # psycopg's bound `load` on the instance, ahead of the method below: psycopg calls it for
        # each value with no Python frame of ours in between.
        self.load = self._psycopgs.load  # type: ignore[method-assign]

    def load(self, data: Any) -> datetime.datetime:  # pragma: no cover - the instance's own is called
        return self._psycopgs.load(data)  # type: ignore[no-any-return]


def timestamptz_loader_register(connection: Any, *, zone: datetime.tzinfo | None) -> bool:
    """Give a new psycopg connection psycopg's own loader where Django's zone is UTC; False elsewhere."""
    if zone != datetime.UTC:
        return False
    connection.adapters.register_loader(TIMESTAMPTZ_OID, UtcTimestamptzLoader)
    return True
