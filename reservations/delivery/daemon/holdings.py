"""What the stand-in daemon believes it holds: per device, per allocation, and where it is behind."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import connection

from reservations.delivery.daemon.base import json_value


def daemon_holdings(*, device_uid: str) -> list[tuple[str, datetime, datetime]]:
    """What the node believes it holds for one device: (reservation id, start, end)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT reservation_id, starts_at, ends_at FROM fake_daemon_assignments WHERE device_uid = %s"
            " ORDER BY starts_at",
            [device_uid],
        )
        return [(row[0], row[1], row[2]) for row in cursor.fetchall()]


@dataclass(frozen=True)
class ClaimHolding:
    """What the node believes one allocation claims: its scalars and profile, for a window."""

    node_id: str
    reservation_id: str
    allocation_id: str
    resources: dict[str, int]
    node_profile: dict[str, Any] | None
    starts_at: datetime
    ends_at: datetime


def daemon_claims(*, reservation_id: str) -> list[ClaimHolding]:
    """What the nodes believe a reservation claims besides atoms, one row per allocation."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT node_id, reservation_id, allocation_id, resources, node_profile, starts_at, ends_at"
            " FROM fake_daemon_claims WHERE reservation_id = %s ORDER BY node_id, allocation_id",
            [reservation_id],
        )
        return [
            ClaimHolding(
                node_id=node_id,
                reservation_id=holder,
                allocation_id=allocation_id,
                resources={name: int(amount) for name, amount in (json_value(resources) or {}).items()},
                node_profile=json_value(profile),
                starts_at=start,
                ends_at=end,
            )
            for node_id, holder, allocation_id, resources, profile, start, end in cursor.fetchall()
        ]


def daemon_behind(*, limit: int = 500) -> list[str]:
    """Live reservations some node does not hold as booked (an atom cut or missing, claims missing).

    Oldest id first. The outbox (`reservations.delivery.outbox`) makes this empty after
    its deliveries; it stays as an on-demand resync for a node that lost its
    own record (`reservations.delivery.sending.reservations_redeliver`).
    """
    with connection.cursor() as cursor:
        cursor.execute(
            """
            SELECT DISTINCT r.id FROM reservations_reservation r
              JOIN reservations_allocation a ON a.reservation_id = r.id
              JOIN inventory_node n ON n.id = a.node_id AND NOT n.agent
              JOIN device_bookings b ON b.allocation_id = a.id
              JOIN inventory_device d ON d.id = b.device_id
             WHERE r.state IN ('scheduled', 'active') AND upper(b.during) > compute_now()
               AND (NOT EXISTS (
                   SELECT 1 FROM fake_daemon_assignments f
                    WHERE f.node_id = a.node_id AND f.reservation_id = r.id AND f.device_uid = d.uid
                      AND f.starts_at = lower(b.during) AND f.ends_at = upper(b.during))
                 OR NOT EXISTS (SELECT 1 FROM fake_daemon_claims c WHERE c.allocation_id = a.id))
             ORDER BY r.id LIMIT %s
            """,
            [limit],
        )
        return [row[0] for row in cursor.fetchall()]
