"""BookingRepair: move future bookings off nodes and atoms that left the schedulable set."""

from __future__ import annotations


def bookings_repair(*, limit: int = 200) -> int:
    """Re-place or mark at risk the reservations whose bookings sit on unschedulable atoms."""
    raise NotImplementedError
