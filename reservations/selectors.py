"""Reservation reads: one reservation, a tenant's list (cursor-paginated), the derived state.

A reservation's state is derived from time by the database clock unless it
was released or preempted: `scheduled` before its start, `active` during it,
`ended` after it; a spot reservation cut by a notice is `preempted` once the
notice has run out.
"""

from __future__ import annotations

import base64
import binascii
from datetime import datetime
from typing import Any

from django.db.models import CharField, Prefetch, Q, QuerySet
from django.db.models.expressions import RawSQL

from core.errors import InvalidInput, NotFound
from reservations.models import Allocation, DeviceBooking, Reservation

DEFAULT_LIMIT = 100
MAX_LIMIT = 500

# The same rule as `reservation_state`, over table reservations_reservation.
STATE_SQL = (
    "CASE WHEN reservations_reservation.state IN ('released', 'preempted') THEN reservations_reservation.state"
    " WHEN reservations_reservation.notice_at IS NOT NULL AND reservations_reservation.ends_at <= compute_now()"
    " THEN 'preempted'"
    " WHEN reservations_reservation.starts_at > compute_now() THEN 'scheduled'"
    " WHEN reservations_reservation.ends_at > compute_now() THEN 'active'"
    " ELSE 'ended' END"
)


def _with_state(queryset: QuerySet[Reservation]) -> QuerySet[Reservation]:
    return queryset.annotate(derived_state=RawSQL(STATE_SQL, [], output_field=CharField()))


def _with_allocations(queryset: QuerySet[Reservation]) -> QuerySet[Reservation]:
    bookings = DeviceBooking.objects.select_related("device").order_by("device__uid")
    allocations = Allocation.objects.order_by("created_at", "id").prefetch_related(
        Prefetch("bookings", queryset=bookings)
    )
    return queryset.prefetch_related(Prefetch("allocations", queryset=allocations))


def reservation_state(reservation: Reservation) -> str:
    """The derived state of one reservation (uses the annotation when the selector added it)."""
    annotated = getattr(reservation, "derived_state", None)
    if annotated:
        return str(annotated)
    row = (
        _with_state(Reservation.objects.filter(pk=reservation.pk))
        .values_list("derived_state", flat=True)
        .first()
    )
    return str(row or reservation.state)


def reservation_get(*, tenant_id: str, reservation_id: str) -> Reservation:
    """The tenant's reservation; another tenant's (or none) is NOT_FOUND, never saying which."""
    reservation = _with_allocations(
        _with_state(Reservation.objects.filter(pk=reservation_id, tenant_id=tenant_id))
    ).first()
    if reservation is None:
        raise NotFound("reservation not found")
    return reservation


def encode_cursor(created_at: datetime, reservation_id: str) -> str:
    return base64.urlsafe_b64encode(f"{created_at.isoformat()}|{reservation_id}".encode()).decode()


def decode_cursor(cursor: str) -> tuple[datetime, str]:
    try:
        text = base64.urlsafe_b64decode(cursor.encode()).decode()
        created, reservation_id = text.split("|", 1)
        return datetime.fromisoformat(created), reservation_id
    except (ValueError, binascii.Error, UnicodeError) as exc:
        raise InvalidInput.field("cursor", "is not a cursor this API returned") from exc


def reservation_list(
    *,
    tenant_id: str,
    pool_id: str | None = None,
    state: str | None = None,
    limit: int = DEFAULT_LIMIT,
    cursor: str | None = None,
) -> tuple[list[Reservation], str | None]:
    """A page of the tenant's reservations, newest first, and the cursor of the next page (or None).

    Keyset pagination on (created_at, id) served by the index
    `reservation_tenant_newest`, so a deep page costs what the first one does.
    """
    if not 1 <= limit <= MAX_LIMIT:
        raise InvalidInput.field("limit", f"must be between 1 and {MAX_LIMIT}")
    queryset = _with_state(Reservation.objects.filter(tenant_id=tenant_id))
    if pool_id:
        queryset = queryset.filter(pool_id=pool_id)
    if state:
        queryset = queryset.filter(derived_state=state)
    if cursor:
        created_at, last_id = decode_cursor(cursor)
        queryset = queryset.filter(Q(created_at__lt=created_at) | Q(created_at=created_at, id__lt=last_id))
    page = list(_with_allocations(queryset.order_by("-created_at", "-id"))[: limit + 1])
    next_cursor = None
    if len(page) > limit:
        page = page[:limit]
        last = page[-1]
        next_cursor = encode_cursor(last.created_at, last.id)
    return page, next_cursor


def reservation_payload(reservation: Reservation) -> dict[str, Any]:
    """The contract's reservation object (times in epoch milliseconds)."""
    from core.clock import to_millis

    allocations = []
    for allocation in reservation.allocations.all():
        allocations.append(
            {
                "id": allocation.id,
                "nodeId": allocation.node_id,
                "atoms": [booking.device.uid for booking in allocation.bookings.all()],
                "resources": dict(allocation.resources or {}),
            }
        )
    notice = None
    if reservation.notice_at is not None:
        notice = {"at": to_millis(reservation.notice_at), "endsAt": to_millis(reservation.notice_ends_at)}
    return {
        "id": reservation.id,
        "tenantId": reservation.tenant_id,
        "poolId": reservation.pool_id,
        "projectId": reservation.project_id,
        "state": reservation_state(reservation),
        "spot": reservation.spot,
        "binding": reservation.binding,
        "start": to_millis(reservation.starts_at),
        "end": to_millis(reservation.ends_at),
        "leaseExpiresAt": to_millis(reservation.lease_expires_at),
        "idempotencyKey": reservation.idempotency_key,
        "createdAt": to_millis(reservation.created_at),
        "allocations": allocations,
        "notice": notice,
    }
