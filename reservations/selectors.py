"""Reservation reads: one reservation, a tenant's list (cursor-paginated), the derived state, the peaks.

A reservation's state is derived from time by the database clock unless it
was released or preempted: `scheduled` before its start, `active` during it,
`ended` after it; a spot reservation cut by a notice is `preempted` once the
notice has run out.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from django.contrib.postgres.expressions import ArraySubquery
from django.db import connection
from django.db.models import (
    CharField,
    OuterRef,
    Prefetch,
    Q,
    QuerySet,
    prefetch_related_objects,
)
from django.db.models.expressions import RawSQL

from core.constants import RESERVATION_ID_REGEX
from core.cursors import cursor_decode, cursor_encode, cursor_invalid, cursor_time
from core.errors import InvalidInput, NotFound
from core.rows import model_columns, model_from_row, model_width
from reservations.models import Allocation, BookingPurpose, DeviceBooking, Reservation, ReservationState

DEFAULT_LIMIT = 100
MAX_LIMIT = 500

# The same rule as `reservation_state`, over table reservations_reservation.
_R = "reservations_reservation"
STATE_SQL = (
    f"CASE WHEN {_R}.state IN ('released', 'preempted') THEN {_R}.state"
    f" WHEN {_R}.notice_at IS NOT NULL AND {_R}.ends_at <= compute_now() THEN 'preempted'"
    f" WHEN {_R}.starts_at > compute_now() THEN 'scheduled'"
    f" WHEN {_R}.ends_at > compute_now() THEN 'active'"
    " ELSE 'ended' END"
)


def _with_state(queryset: QuerySet[Reservation]) -> QuerySet[Reservation]:
    state = RawSQL(STATE_SQL, [], output_field=CharField())  # noqa: S611 - a constant, no input
    return queryset.annotate(derived_state=state)


def _allocations_prefetch() -> Prefetch[Any]:
    # One query for every allocation of the page with its atoms' uids (ordered
    # by uid), instead of one for allocations and one for bookings and devices.
    uids = ArraySubquery(
        DeviceBooking.objects.filter(allocation=OuterRef("pk")).order_by("device__uid").values("device__uid")
    )
    allocations = Allocation.objects.order_by("created_at", "id").annotate(atom_uids=uids)
    return Prefetch("allocations", queryset=allocations)


def _with_allocations(queryset: QuerySet[Reservation]) -> QuerySet[Reservation]:
    return queryset.prefetch_related(_allocations_prefetch())


def reservation_allocations_load(reservation: Reservation) -> Reservation:
    """Load the allocations with their atoms onto a reservation already in hand (one query)."""
    prefetch_related_objects([reservation], _allocations_prefetch())
    return reservation


def reservation_lock(*, reservation_id: str, tenant_id: str | None = None) -> Reservation | None:
    """The reservation row locked `FOR UPDATE`, with its derived state and `compute_now()` (one query).

    The lock serializes concurrent releases, renewals and spot notices of one
    reservation; `tenant_id` (when given) makes another tenant's reservation
    look absent. Plain SQL, the row made into a model the way the ORM does
    (`Model.from_db`): the release's hot path builds no queryset.
    """
    columns, width = model_columns(Reservation, _R), model_width(Reservation)
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT {columns}, {STATE_SQL}, compute_now() FROM {_R}"
            f" WHERE {_R}.id = %(id)s AND (%(tenant)s::varchar IS NULL OR {_R}.tenant_id = %(tenant)s)"
            f" FOR UPDATE OF {_R}",
            {"id": reservation_id, "tenant": tenant_id},
        )
        row = cursor.fetchone()
    if row is None:
        return None
    reservation = model_from_row(Reservation, row)
    reservation.derived_state = row[width]  # type: ignore[attr-defined]
    reservation.db_now = row[width + 1]  # type: ignore[attr-defined]
    return reservation


def reservation_state(reservation: Reservation) -> str:
    """The derived state of one reservation (uses the annotation when the selector added it)."""
    annotated = getattr(reservation, "derived_state", None)
    if annotated:
        return str(annotated)
    row = (
        _with_state(Reservation.objects.filter(pk=reservation.pk))
        .values_list("derived_state", flat=True)  # type: ignore[misc]
        .first()
    )
    return str(row or reservation.state)


# One reservation's allocations in the contract's shape, atoms by uid, in the order the
# prefetch gives them (created, then id): the answer of `get`, `release` and `renew` in the
# same query as the row, not a second one.
def allocations_json_sql(reservation_id: str) -> str:
    """A reservation's allocations as the answer shows them (JSON text), for the row `reservation_id` names.

    An expression for another statement's select list: the release answers from
    the statement that releases (`reservations.services`).
    """
    return f"""
COALESCE((SELECT json_agg(json_build_object(
        'id', a.id, 'nodeId', a.node_id,
        'atoms', ARRAY(SELECT d.uid FROM device_bookings b JOIN inventory_device d ON d.id = b.device_id
                        WHERE b.allocation_id = a.id ORDER BY d.uid),
        'resources', COALESCE(a.resources, '{{}}'::jsonb), 'placement', a.placement)
        ORDER BY a.created_at, a.id)
   FROM reservations_allocation a WHERE a.reservation_id = {reservation_id}), '[]')::text
"""


_ALLOCATIONS_JSON_SQL = allocations_json_sql(f"{_R}.id")


def reservation_get(*, tenant_id: str, reservation_id: str) -> Reservation:
    """The tenant's reservation; another tenant's (or none) is NOT_FOUND, never saying which.

    One query, in plain SQL: the row, its derived state and its allocations
    (`reservation_payload` answers from them).
    """
    columns = model_columns(Reservation, _R)
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT {columns}, {STATE_SQL}, {_ALLOCATIONS_JSON_SQL} FROM {_R}"
            f" WHERE {_R}.id = %(id)s AND {_R}.tenant_id = %(tenant)s",
            {"id": reservation_id, "tenant": tenant_id},
        )
        row = cursor.fetchone()
    if row is None:
        raise NotFound("reservation not found")
    width = model_width(Reservation)
    reservation = model_from_row(Reservation, row)
    reservation.derived_state = row[width]  # type: ignore[attr-defined]
    reservation.allocations_json = row[width + 1]  # type: ignore[attr-defined]
    return reservation


def encode_cursor(created_at: datetime, reservation_id: str) -> str:
    return cursor_encode(created_at.isoformat(), reservation_id)


def decode_cursor(cursor: str) -> tuple[datetime, str]:
    """The (created_at, id) an `encode_cursor` wrote; anything else (a NUL, a naive time) is INVALID_INPUT."""
    created, reservation_id = cursor_decode(cursor, count=2)
    created_at = cursor_time(created)
    if re.fullmatch(RESERVATION_ID_REGEX, reservation_id) is None:
        raise cursor_invalid()
    return created_at, reservation_id


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
        queryset = queryset.filter(derived_state=state)  # type: ignore[misc]
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


def reservation_payload(
    reservation: Reservation,
    *,
    state: str | None = None,
    allocations: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """The contract's reservation object (times in epoch milliseconds).

    `state` and `allocations`: what the caller already knows (a create that just
    placed it, `ReservationCreated`), else the derived state and the stored rows.
    """
    from core.clock import to_millis

    # A reservation read by a selector has its allocations prefetched, or read with it as JSON.
    loaded = getattr(reservation, "allocations_json", None)
    if allocations is None and loaded is not None:
        allocations = json.loads(loaded)
    elif allocations is None:
        allocations = []
        for allocation in reservation.allocations.all():
            atoms = getattr(allocation, "atom_uids", None)
            if atoms is None:
                atoms = allocation.bookings.order_by("device__uid").values_list("device__uid", flat=True)
            allocations.append(
                {
                    "id": allocation.id,
                    "nodeId": allocation.node_id,
                    "atoms": list(atoms),
                    "resources": dict(allocation.resources or {}),
                    "placement": allocation.placement,
                }
            )
    else:
        # A create's answer is built before any node answered: no placement yet.
        allocations = [{**allocation, "placement": allocation.get("placement")} for allocation in allocations]
    notice = None
    if reservation.notice_at is not None:
        notice = {"at": to_millis(reservation.notice_at), "endsAt": to_millis(reservation.notice_ends_at)}
    state = state or reservation_state(reservation)
    return {
        "id": reservation.id,
        "tenantId": reservation.tenant_id,
        "poolId": reservation.pool_id,
        "projectId": reservation.project_id,
        "state": state,
        "spot": reservation.spot,
        "binding": reservation.binding,
        "start": to_millis(reservation.starts_at),
        "end": to_millis(reservation.ends_at),
        "leaseExpiresAt": to_millis(reservation.lease_expires_at),
        "idempotencyKey": reservation.idempotency_key,
        "createdAt": to_millis(reservation.created_at),
        "allocations": allocations,
        "notice": notice,
        "atRisk": reservation_at_risk(reservation, state=state),
    }


def reservation_at_risk(reservation: Reservation, *, state: str) -> dict[str, Any] | None:
    """`{reason, since}` while a live reservation is marked at risk by BookingRepair, else None.

    The mark outlives the reservation until the next repair run clears it; a
    reservation that ended or was released is not at risk of anything.
    """
    from core.clock import to_millis

    if reservation.at_risk_since is None or state not in ("scheduled", "active"):
        return None
    return {"reason": reservation.at_risk_reason, "since": to_millis(reservation.at_risk_since)}


def reservations_live_count(*, pool_id: str, tenant_id: str) -> int:
    """How many of the tenant's reservations in the pool are live (scheduled or active)."""
    return Reservation.objects.filter(
        pool_id=pool_id, tenant_id=tenant_id, state__in=[ReservationState.SCHEDULED, ReservationState.ACTIVE]
    ).count()


# A tenant's holdings over time, for `concurrent` quotas (`ledger.models.QuotaMode`): such
# a quota limits how much a tenant holds at any one instant, not the sum of all it ever
# booked. Its check needs the reservations' rows, which this layer owns, so the ledger's
# charge (`ledger.services.quota.quota_charge`) asks for the peak through the callable
# `placement_charge` hands it, after it has locked the quota row. What a tenant holds of
# a resource at an instant is counted the way the charge counts it
# (`placer.commit.placement_charges`): the atoms of each class booked then by its live
# allocations (not released, of a scheduled or active reservation in the pool), one per
# booking, and the scalars its live allocations claim over `[starts_at, ends_at)`.
#
# The peak per resource of the tenant's live holdings over [start, end), by a
# sweep: each holding adds its amount where it starts (clipped to the window)
# and takes it away where it ends (if inside the window); the running sum in
# time order is the use at each instant, and the changes at one instant are
# peers of one window frame (RANGE), so an end and a start at the same instant
# never count together (the ranges are half-open).
#
# The cost follows the tenant's live reservations in the pool, never the
# pool's or the platform's bookings: `reservation_tenant_pool_live` finds the
# reservations that overlap the window, and each one's holdings are read by a
# LATERAL subquery per reservation (its GROUP BY keeps the planner from
# flattening it into a join it could drive from the bookings of every tenant),
# through the allocations' (reservation, node) index and `booking_allocation`.
_PEAKS_SQL = f"""
WITH held AS (
    SELECT h.resource, h.lo, h.hi, h.amount
      FROM reservations_reservation r
     CROSS JOIN LATERAL (
           SELECT d.device_class AS resource, lower(b.during) AS lo, upper(b.during) AS hi,
                  count(*) AS amount
             FROM reservations_allocation a
             JOIN device_bookings b ON b.allocation_id = a.id
             JOIN inventory_device d ON d.id = b.device_id
            WHERE a.reservation_id = r.id AND NOT a.released AND b.purpose = '{BookingPurpose.ALLOCATION}'
              AND d.device_class = ANY(%(resources)s::varchar[])
            GROUP BY 1, 2, 3
           UNION ALL
           SELECT kv.key, r.starts_at, r.ends_at, sum((kv.value #>> '{{}}')::bigint)
             FROM reservations_allocation a, jsonb_each(a.resources) kv
            WHERE a.reservation_id = r.id AND NOT a.released AND kv.key = ANY(%(resources)s::varchar[])
            GROUP BY 1
           ) h
     WHERE r.tenant_id = %(tenant)s AND r.pool_id = %(pool)s AND r.state IN ('scheduled', 'active')
       AND r.starts_at < %(end)s AND r.ends_at > %(start)s
       AND h.lo < %(end)s AND h.hi > %(start)s
),
changes AS (
    SELECT resource, GREATEST(lo, %(start)s) AS at, amount FROM held
    UNION ALL
    SELECT resource, hi, -amount FROM held WHERE hi < %(end)s
)
SELECT resource, max(in_use)::bigint
  FROM (SELECT resource, sum(amount) OVER (PARTITION BY resource ORDER BY at) AS in_use FROM changes) s
 GROUP BY resource
"""


def holdings_peaks(
    resources: Sequence[str], *, tenant_id: str, pool_id: str, start: datetime, end: datetime
) -> dict[str, int]:
    """The tenant's peak use of each resource in the pool over [start, end), in one statement.

    `resources` comes first so that the quota charge's `window_peaks` (called
    with the resources alone) can be this function with the window bound.

    Includes what the calling transaction has booked and claimed itself, so a
    charge compares the peak with its new reservation in it. A resource held
    nowhere in the window is absent (its peak is 0).
    """
    with connection.cursor() as cursor:
        cursor.execute(
            _PEAKS_SQL,
            {"tenant": tenant_id, "pool": pool_id, "start": start, "end": end, "resources": list(resources)},
        )
        return {resource: int(peak) for resource, peak in cursor.fetchall()}
