"""Booking phases on time: move bookings from `reserved` to `allocated` to over, with their deltas."""

from __future__ import annotations


def bookings_advance(*, limit: int = 5000) -> int:
    """Move every booking whose start or end has passed to its phase; return how many moved."""
    raise NotImplementedError
