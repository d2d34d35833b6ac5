"""The spot notice: a regular reservation that displaces a spot one cuts it to end when the notice does.

The commit (`reservations.placer.commit`) gives the notice inside the
displacing option's savepoint, so a lost race takes the notice back with the
option. The cut gives the spot reservation's scalars and quota back at notice
time; the spot reads `preempted` once its notice has run out, or at once when
it had not started.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from reservations.models import Reservation
from reservations.placer.cut import reservation_cut


def spot_notice(*, reservation_id: str, ends_at: datetime, now: datetime) -> bool:
    """Cut a spot reservation to end at `ends_at` and record the notice on it; whether it was cut."""
    # Locks the spot reservation so a concurrent release or a second notice waits for this one.
    reservation = Reservation.objects.select_for_update().get(pk=reservation_id)
    if reservation.state in ("released", "preempted") or reservation.ends_at <= ends_at:
        return False
    reservation_cut(reservation_id=reservation_id, at=ends_at, now=now)
    updates: dict[str, Any] = {"notice_at": now, "notice_ends_at": ends_at}
    if ends_at > reservation.starts_at:
        updates["ends_at"] = ends_at
    else:
        # It had not started yet: nothing of it is left.
        updates.update(
            state="preempted", released_at=now, release_reason="displaced by a regular reservation"
        )
    Reservation.objects.filter(pk=reservation_id).update(**updates)
    return True
