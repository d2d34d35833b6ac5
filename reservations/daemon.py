"""A fake node daemon: guard 6, defence in depth on the node side.

The real daemon keeps its own record of what it was told to run and refuses
an assignment that overlaps one it already holds, whatever the control plane
believes. This stand-in keeps that record in its own table,
`fake_daemon_assignments` (node, device uid, reservation, `[starts_at, ends_at)`),
and checks overlaps in Python against what it holds, never trusting the
control plane's constraint. A refused assignment answers `AllocationFailed`,
and the control plane releases the reservation. This module never calls the
control plane: it answers, and the caller acts.

Assignments are delivered after the booking transaction commits
(`transaction.on_commit`), never while the placer's locks are held.
"""

from __future__ import annotations

import logging
from datetime import datetime
from functools import partial

from django.db import connection, transaction

logger = logging.getLogger(__name__)


class AllocationFailed(Exception):
    """The node refused an assignment that overlaps one it already holds."""

    def __init__(self, device_uid: str, holder: str) -> None:
        super().__init__(f"{device_uid} is already assigned to {holder}")
        self.device_uid = device_uid
        self.holder = holder


Assignment = tuple[str, datetime, datetime]  # (device uid, start, end)


def daemon_assign(
    *, node_id: str, reservation_id: str, allocation_id: str, assignments: list[Assignment]
) -> None:
    """Accept the assignments on this node, or refuse them all with AllocationFailed."""
    with transaction.atomic(), connection.cursor() as cursor:
        # One node's daemon handles one assignment at a time, as a real agent would.
        cursor.execute("SELECT pg_advisory_xact_lock(hashtext('fake-daemon:' || %s))", [node_id])
        cursor.execute(
            "SELECT device_uid, reservation_id, starts_at, ends_at FROM fake_daemon_assignments"
            " WHERE node_id = %s AND device_uid = ANY(%s)",
            [node_id, [uid for uid, _, _ in assignments]],
        )
        held: dict[str, list[tuple[str, datetime, datetime]]] = {}
        for uid, holder, start, end in cursor.fetchall():
            held.setdefault(uid, []).append((holder, start, end))
        fresh: list[Assignment] = []
        for uid, start, end in assignments:
            already = False
            for holder, held_start, held_end in held.get(uid, []):
                if holder == reservation_id:
                    already = already or (held_start, held_end) == (start, end)
                elif start < held_end and held_start < end:
                    raise AllocationFailed(uid, holder)
            if not already:  # a redelivery adds only what the node lacks
                fresh.append((uid, start, end))
        for uid, start, end in fresh:
            cursor.execute(
                "INSERT INTO fake_daemon_assignments"
                " (node_id, device_uid, reservation_id, allocation_id, starts_at, ends_at)"
                " VALUES (%s, %s, %s, %s, %s, %s)",
                [node_id, uid, reservation_id, allocation_id, start, end],
            )


def _bookings_of(reservation_id: str) -> dict[tuple[str, str], list[Assignment]]:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT a.node_id, a.id, d.uid, lower(b.during), upper(b.during)"
            " FROM reservations_allocation a JOIN device_bookings b ON b.allocation_id = a.id"
            " JOIN inventory_device d ON d.id = b.device_id WHERE a.reservation_id = %s ORDER BY d.uid",
            [reservation_id],
        )
        out: dict[tuple[str, str], list[Assignment]] = {}
        for node_id, allocation_id, uid, start, end in cursor.fetchall():
            out.setdefault((node_id, allocation_id), []).append((uid, start, end))
    return out


def _known_reservation(reservation_id: str) -> bool:
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1 FROM reservations_reservation WHERE id = %s", [reservation_id])
        return cursor.fetchone() is not None


def daemon_deliver(*, reservation_id: str) -> AllocationFailed | None:
    """Send a committed reservation's bookings to its nodes; the refusal, if a node refused.

    The daemon only answers; the control plane (`reservations.services.reservation_deliver`)
    releases a refused reservation.
    """
    try:
        for (node_id, allocation_id), assignments in sorted(_bookings_of(reservation_id).items()):
            assign = partial(
                daemon_assign,
                node_id=node_id,
                reservation_id=reservation_id,
                allocation_id=allocation_id,
                assignments=assignments,
            )
            try:
                assign()
            except AllocationFailed as exc:
                # A release commits, then tells the node (after commit); a create that
                # books the freed atoms can deliver before that news arrives. When the
                # holder is a reservation the control plane knows, bring the node's
                # record of it up to date and ask once more: a holder still booked keeps
                # its rows, and one the node holds without the control plane knowing it
                # is never dropped, so a true overlap is still refused.
                if not _known_reservation(exc.holder):
                    raise
                daemon_shorten(reservation_id=exc.holder)
                assign()
    except AllocationFailed as exc:
        logger.warning("node refused reservation %s: %s", reservation_id, exc)
        return exc
    return None


def daemon_shorten(*, reservation_id: str) -> None:
    """Bring the node's record of a reservation in line with its (shortened) bookings.

    Only what the node accepted is ever kept: rows are cut or dropped, never
    added, so a refused assignment leaves no trace on the node.
    """
    current: dict[tuple[str, str], datetime] = {}
    for (_node_id, allocation_id), assignments in _bookings_of(reservation_id).items():
        for uid, _start, end in assignments:
            current[(allocation_id, uid)] = end
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(
            "SELECT id, allocation_id, device_uid, starts_at, ends_at FROM fake_daemon_assignments"
            " WHERE reservation_id = %s FOR UPDATE",
            [reservation_id],
        )
        for row_id, allocation_id, uid, start, end in cursor.fetchall():
            booked_end = current.get((allocation_id, uid))
            if booked_end is None or booked_end <= start:
                cursor.execute("DELETE FROM fake_daemon_assignments WHERE id = %s", [row_id])
            elif booked_end < end:
                cursor.execute(
                    "UPDATE fake_daemon_assignments SET ends_at = %s WHERE id = %s", [booked_end, row_id]
                )


def daemon_holdings(*, device_uid: str) -> list[tuple[str, datetime, datetime]]:
    """What the node believes it holds for one device: (reservation id, start, end)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT reservation_id, starts_at, ends_at FROM fake_daemon_assignments WHERE device_uid = %s"
            " ORDER BY starts_at",
            [device_uid],
        )
        return [(row[0], row[1], row[2]) for row in cursor.fetchall()]


def daemon_behind(*, limit: int = 500) -> list[str]:
    """Live reservations some node does not hold as booked (cut or missing), oldest id first.

    Delivery runs after commit, so a crash, a lost connection or a restart
    between the commit and the node can leave a node behind; the reconciler
    redelivers these (`reservations.services.reservations_redeliver`).
    """
    with connection.cursor() as cursor:
        cursor.execute(
            """
            SELECT DISTINCT r.id FROM reservations_reservation r
              JOIN reservations_allocation a ON a.reservation_id = r.id
              JOIN device_bookings b ON b.allocation_id = a.id
              JOIN inventory_device d ON d.id = b.device_id
             WHERE r.state IN ('scheduled', 'active') AND upper(b.during) > compute_now()
               AND NOT EXISTS (
                   SELECT 1 FROM fake_daemon_assignments f
                    WHERE f.node_id = a.node_id AND f.reservation_id = r.id AND f.device_uid = d.uid
                      AND f.starts_at = lower(b.during) AND f.ends_at = upper(b.during))
             ORDER BY r.id LIMIT %s
            """,
            [limit],
        )
        return [row[0] for row in cursor.fetchall()]
