"""The reads that name maintenance windows: in a refusal, in `capacity/explain`, in BookingRepair's reasons.

Nothing here writes and nothing imports the placer, so the placer, repair and
the window's services all read windows through the same few statements.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import connection

# A phrase names at most this many nodes of a window, then counts the rest.
PHRASE_NODES = 3
# A refusal names at most this many windows.
PHRASE_WINDOWS = 3

LIVE_WINDOW = "w.state IN ('scheduled', 'active') AND w.ends_at > compute_now()"

# The live reservations with an allocation booking inside a live window on the window's nodes,
# still to come or running: the window's conflicts. `%(window)s` NULL: every window's.
CONFLICTS_SQL = f"""
SELECT DISTINCT a.reservation_id, w.id
  FROM reservations_maintenancewindow w
  JOIN reservations_maintenancewindownode m ON m.window_id = w.id
  JOIN inventory_device d ON d.node_id = m.node_id
  JOIN device_bookings b ON b.device_id = d.id
  JOIN reservations_allocation a ON a.id = b.allocation_id
  JOIN reservations_reservation r ON r.id = a.reservation_id
 WHERE {LIVE_WINDOW} AND (%(window)s::varchar IS NULL OR w.id = %(window)s)
   AND b.purpose = 'allocation' AND b.phase IN (0, 1)
   AND COALESCE(upper(b.during), 'infinity'::timestamptz) > GREATEST(w.starts_at, compute_now())
   AND lower(b.during) < w.ends_at
   AND NOT a.released AND r.state IN ('scheduled', 'active')
 ORDER BY 1, 2
"""

# The same, as a predicate over a reservation id column (BookingRepair's candidates).
IN_WINDOW_RESERVATIONS_SQL = f"""
SELECT a.reservation_id AS id
  FROM reservations_maintenancewindow w
  JOIN reservations_maintenancewindownode m ON m.window_id = w.id
  JOIN inventory_device d ON d.node_id = m.node_id
  JOIN device_bookings b ON b.device_id = d.id
  JOIN reservations_allocation a ON a.id = b.allocation_id
 WHERE {LIVE_WINDOW}
   AND b.purpose = 'allocation' AND b.phase IN (0, 1)
   AND COALESCE(upper(b.during), 'infinity'::timestamptz) > GREATEST(w.starts_at, compute_now())
   AND lower(b.during) < w.ends_at AND NOT a.released
"""

_RESERVATION_WINDOWS_SQL = f"""
SELECT DISTINCT w.id, w.reason, w.starts_at, w.ends_at, m.node_id
  FROM reservations_allocation a
  JOIN device_bookings b ON b.allocation_id = a.id
  JOIN inventory_device d ON d.id = b.device_id
  JOIN reservations_maintenancewindownode m ON m.node_id = d.node_id
  JOIN reservations_maintenancewindow w ON w.id = m.window_id
 WHERE a.reservation_id = %(reservation)s AND NOT a.released AND b.phase IN (0, 1)
   AND {LIVE_WINDOW}
   AND COALESCE(upper(b.during), 'infinity'::timestamptz) > GREATEST(w.starts_at, compute_now())
   AND lower(b.during) < w.ends_at
 ORDER BY w.starts_at, w.id, m.node_id
"""

_OVERLAPPING_SQL = f"""
SELECT w.id, w.reason, w.starts_at, w.ends_at, m.node_id
  FROM reservations_maintenancewindow w
  JOIN reservations_maintenancewindownode m ON m.window_id = w.id
  JOIN inventory_node n ON n.id = m.node_id
 WHERE {LIVE_WINDOW} AND w.starts_at < %(end)s AND w.ends_at > %(start)s
   AND (%(pool)s::varchar IS NULL OR n.pool_id = %(pool)s)
   AND (%(nodes)s::varchar[] IS NULL OR m.node_id = ANY(%(nodes)s::varchar[]))
 ORDER BY w.starts_at, w.id, m.node_id
"""


@dataclass(frozen=True)
class WindowRef:
    """A window as a phrase names it: its id, its reason (its name), its span and its nodes."""

    id: str
    reason: str
    starts_at: datetime
    ends_at: datetime
    node_ids: tuple[str, ...]

    @property
    def phrase(self) -> str:
        """`maintenance window 'firmware' on node_… from … to …`: what every refusal and reason says."""
        return window_phrase(
            reason=self.reason, node_ids=self.node_ids, starts_at=self.starts_at, ends_at=self.ends_at
        )


def iso(moment: datetime) -> str:
    """An instant as the reasons write it: `2030-01-01T00:00:00Z`."""
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def window_phrase(*, reason: str, node_ids: tuple[str, ...], starts_at: datetime, ends_at: datetime) -> str:
    nodes = ", ".join(node_ids[:PHRASE_NODES])
    if len(node_ids) > PHRASE_NODES:
        nodes += f" and {len(node_ids) - PHRASE_NODES} more"
    return f"maintenance window {reason!r} on {nodes} from {iso(starts_at)} to {iso(ends_at)}"


def _refs(rows: list[tuple[Any, ...]]) -> list[WindowRef]:
    nodes: dict[str, list[str]] = defaultdict(list)
    spans: dict[str, tuple[str, datetime, datetime]] = {}
    for window_id, reason, starts_at, ends_at, node_id in rows:
        spans.setdefault(window_id, (reason, starts_at, ends_at))
        nodes[window_id].append(node_id)
    return [
        WindowRef(id=w, reason=r, starts_at=s, ends_at=e, node_ids=tuple(nodes[w]))
        for w, (r, s, e) in spans.items()
    ]


def _rows(sql: str, params: dict[str, Any]) -> list[tuple[Any, ...]]:
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.fetchall()


def windows_overlapping(
    *, start: datetime, end: datetime, pool_id: str | None = None, node_ids: list[str] | None = None
) -> list[WindowRef]:
    """The live windows overlapping `[start, end)`, of a pool's nodes or of these nodes, earliest first."""
    rows = _rows(_OVERLAPPING_SQL, {"start": start, "end": end, "pool": pool_id, "nodes": node_ids})
    return _refs(rows)


def windows_refusal_phrase(*, pool_id: str, start: datetime, end: datetime) -> str:
    """What a refusal adds when windows hold nodes of the pool during the request's window ('' if none)."""
    refs = windows_overlapping(start=start, end=end, pool_id=pool_id)
    if not refs:
        return ""
    named = [ref.phrase for ref in refs[:PHRASE_WINDOWS]]
    if len(refs) > PHRASE_WINDOWS:
        named.append(f"and {len(refs) - PHRASE_WINDOWS} more windows")
    return "; held by " + "; ".join(named)


def reservation_windows(reservation_id: str) -> list[WindowRef]:
    """The live windows the reservation's live bookings sit in (BookingRepair's reason names them)."""
    return _refs(_rows(_RESERVATION_WINDOWS_SQL, {"reservation": reservation_id}))


def window_conflicts(*, window_id: str | None = None) -> list[tuple[str, str]]:
    """(reservation, window) for every live reservation booked inside a live window (or inside this one)."""
    return [(r, w) for r, w in _rows(CONFLICTS_SQL, {"window": window_id})]
