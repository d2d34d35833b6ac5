"""Reservation writes: create (idempotent, optionally waiting), release, renew, lease expiry.

One transaction per create holds everything that belongs together: the
reservation row, its allocations and bookings, the scalar claims, the quota
charge and the rollup deltas. What talks to the outside (the node daemon,
waiting clients) runs after commit.

Waiting (`wait.timeoutMs`): a create that does not fit LISTENs on
`capacity_released` and retries when a release in its pool commits (every
release sends `pg_notify` inside its transaction, delivered at commit), until
the timeout. There is no sleep loop.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.db import IntegrityError, OperationalError, connection, transaction

from core.clock import compute_now
from core.constants import DEADLOCK_DETECTED
from core.errors import Conflict, IdempotencyConflict, NoCapacity, NotFound
from core.services import audit_record
from inventory.models import Pool
from reservations.daemon import daemon_behind, daemon_deliver, daemon_shorten
from reservations.models import Reservation
from reservations.placer.commit import placement_charge, placement_commit, reservation_cut
from reservations.placer.plan import placement_window
from reservations.request import canonical_request_digest
from reservations.request_types import ReservationRequest
from reservations.validation import reservation_request_check
from reservations.waits import LISTENER, notify_release, wait_for_release, wait_slot

logger = logging.getLogger(__name__)

RELEASE_ATTEMPTS = 3
IDEMPOTENCY_CONSTRAINT = "reservation_unique_idempotency_key"


def request_digest(request: ReservationRequest) -> str:
    """The canonical digest of what the request asks for (not how long the client waits)."""
    return canonical_request_digest(request)


def _same_or_conflict(existing: Reservation, digest: str) -> Reservation:
    if existing.request_digest != digest:
        raise IdempotencyConflict(
            "idempotencyKey was already used with a different request",
            [{"field": "idempotencyKey", "message": "already used with a different request"}],
        )
    return existing


def _existing(request: ReservationRequest) -> Reservation | None:
    return Reservation.objects.filter(
        tenant_id=request.tenant_id, idempotency_key=request.idempotency_key
    ).first()


_INSERT_RESERVATION_SQL = """
INSERT INTO reservations_reservation (id, tenant_id, pool_id, project_id, request, request_digest,
    idempotency_key, spot, binding, starts_at, ends_at, state, lease_seconds, lease_expires_at,
    release_reason, created_at)
VALUES (%(id)s, %(tenant_id)s, %(pool_id)s, %(project_id)s, %(request)s::jsonb, %(request_digest)s,
    %(idempotency_key)s, %(spot)s, %(binding)s, %(starts_at)s, %(ends_at)s, %(state)s, %(lease_seconds)s,
    %(lease_expires_at)s, '', compute_now())
ON CONFLICT (tenant_id, idempotency_key) DO NOTHING
RETURNING created_at
"""


def _insert_params(reservation: Reservation) -> dict[str, Any]:
    return {
        "id": reservation.id,
        "tenant_id": reservation.tenant_id,
        "pool_id": reservation.pool_id,
        "project_id": reservation.project_id,
        "request": json.dumps(reservation.request),
        "request_digest": reservation.request_digest,
        "idempotency_key": reservation.idempotency_key,
        "spot": reservation.spot,
        "binding": reservation.binding,
        "starts_at": reservation.starts_at,
        "ends_at": reservation.ends_at,
        "state": reservation.state,
        "lease_seconds": reservation.lease_seconds,
        "lease_expires_at": reservation.lease_expires_at,
    }


@dataclass(frozen=True)
class ReservationCreated:
    """What `reservation_create` did: the reservation, whether this call made it, and what it booked."""

    reservation: Reservation
    created: bool
    # The allocations as the placement wrote them (the API answers from these
    # without reading back); None when an earlier create with the key is answered.
    allocations: list[dict[str, Any]] | None = None

    def __iter__(self) -> Iterator[Any]:
        # Unpacks as `(reservation, created)` for callers that need only those two.
        yield self.reservation
        yield self.created


def _create_once(*, request: ReservationRequest, digest: str, actor: str, pool: Pool) -> ReservationCreated:
    with transaction.atomic():
        window = placement_window(request=request)
        reservation = Reservation(
            tenant_id=request.tenant_id,
            pool_id=request.pool_id,
            project_id=request.project_id,
            request=request.raw,
            request_digest=digest,
            idempotency_key=request.idempotency_key,
            spot=request.spot,
            binding=request.binding,
            starts_at=window.start,
            ends_at=window.end,
            state="active" if window.start <= window.now else "scheduled",
            lease_seconds=request.lease_seconds,
            lease_expires_at=(
                window.now + timedelta(seconds=request.lease_seconds) if request.lease_seconds else None
            ),
        )
        # The unique (tenant, idempotency_key) index decides a race of two
        # identical creates: the second INSERT waits for the first transaction
        # and, if it committed, inserts nothing (no error, so no savepoint is
        # needed around it); the winner's reservation is then answered.
        with connection.cursor() as cursor:
            cursor.execute(_INSERT_RESERVATION_SQL, _insert_params(reservation))
            inserted = cursor.fetchone()
        if inserted is None:
            existing = _existing(request)
            if existing is None:  # pragma: no cover - the winner committed, so it is visible
                raise IntegrityError(f"{IDEMPOTENCY_CONSTRAINT}: the winning create is not visible")
            return ReservationCreated(reservation=_same_or_conflict(existing, digest), created=False)
        reservation.created_at = inserted[0]
        reservation._state.adding = False

        placement = placement_commit(reservation=reservation, request=request, pool=pool, window=window)
        if placement.window != window:
            # Displacing spot reservations moved the start to the end of their notice.
            reservation.starts_at = placement.window.start
            reservation.ends_at = placement.window.end
            reservation.state = "active" if placement.window.start <= placement.window.now else "scheduled"
            reservation.save(update_fields=["starts_at", "ends_at", "state"])
        placement_charge(placement=placement, request=request)
        # The answer is built from what was just written, not read back.
        allocations = [
            {
                "id": allocation.id,
                "nodeId": allocation.node_id,
                "atoms": sorted(member.atoms),
                "resources": dict(allocation.resources or {}),
            }
            # Allocations of one transaction share `created_at`; the selectors order them by id next.
            for allocation, member in sorted(placement.allocations, key=lambda taken: taken[0].id)
        ]
        reservation_id = reservation.id
        displaced = list(placement.displaced_reservations)

        def deliver() -> None:
            # The booking is committed; a node that cannot be told now is
            # reconciled later, it must not turn a made reservation into an error.
            try:
                for spot_id in displaced:
                    daemon_shorten(reservation_id=spot_id)
                reservation_deliver(reservation_id=reservation_id)
            except Exception:
                logger.exception("delivering reservation %s to its nodes failed", reservation_id)

        transaction.on_commit(deliver)
    return ReservationCreated(reservation=reservation, created=True, allocations=allocations)


def reservation_create(
    *, request: ReservationRequest, actor: str, pool: Pool | None = None
) -> ReservationCreated:
    """Place and book the request; return the reservation and whether it was created now.

    Idempotent per (tenant, idempotencyKey): the same request returns the same
    reservation, a different one raises `IdempotencyConflict`.

    `pool` is the pool of a `reservations.validation.ResolvedRequest` (the
    API's view): the request was checked against it, pool, project and sharing
    mode, and is not checked again here. Without it (the CLI, scripts, tests)
    the request goes through `reservation_request_check`, the same checks
    without a principal.
    """
    if pool is None:
        pool = reservation_request_check(request).pool
    elif pool.pk != request.pool_id:
        raise ValueError(f"the resolved pool {pool.pk} is not the request's pool {request.pool_id}")
    digest = request_digest(request)
    existing = _existing(request)
    if existing is not None:
        return ReservationCreated(reservation=_same_or_conflict(existing, digest), created=False)
    # Waiting needs notifications, which arrive only between transactions: a
    # caller that already holds a transaction gets one attempt.
    can_wait = request.wait_timeout_ms > 0 and not connection.in_atomic_block
    deadline = time.monotonic() + request.wait_timeout_ms / 1000
    try:
        return _create_once(request=request, digest=digest, actor=actor, pool=pool)
    except NoCapacity:
        if not can_wait:
            raise
    # It did not fit and may wait: bounded (a slot of the tenant's and of this process's),
    # and holding no database connection while it waits (`reservations.waits`).
    with (
        wait_slot(tenant_id=request.tenant_id, seconds=request.wait_timeout_ms / 1000),
        LISTENER.registered(request.pool_id) as released,
    ):
        LISTENER.start()
        while True:
            # A release that commits during this attempt sets the event: no wake-up is lost.
            released.clear()
            try:
                return _create_once(request=request, digest=digest, actor=actor, pool=pool)
            except NoCapacity:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise
                wait_for_release(event=released, seconds=remaining)


def reservation_release(
    *, reservation: Reservation, actor: str, reason: str = "", tenant_id: str | None = None
) -> Reservation:
    """End the reservation now: running bookings end at `compute_now()`, future ones are deleted.

    Scalars, quota and rollup counts are given back once; releasing twice is
    harmless. With `tenant_id`, another tenant's reservation is NOT_FOUND
    (only `reservation.pk` is read, so the API passes an unsaved stub).
    """
    attempts = 1 if connection.in_atomic_block else RELEASE_ATTEMPTS
    for attempt in range(attempts):
        try:
            return _release_once(
                reservation_id=reservation.pk, actor=actor, reason=reason, tenant_id=tenant_id
            )
        except OperationalError as exc:
            # A gang placement can hold one node's scalar row while it waits for
            # this release's bookings; PostgreSQL breaks that cycle by failing
            # one side. A release is safe to run again from the start.
            if getattr(exc.__cause__, "sqlstate", None) != DEADLOCK_DETECTED or attempt == attempts - 1:
                raise
    raise AssertionError("unreachable")  # pragma: no cover


def _release_once(*, reservation_id: str, actor: str, reason: str, tenant_id: str | None) -> Reservation:
    from reservations.selectors import reservation_lock, reservation_state

    with transaction.atomic():
        # Serializes concurrent releases (and a spot notice) of one reservation;
        # the same query reads its derived state and the database's clock.
        locked = reservation_lock(reservation_id=reservation_id, tenant_id=tenant_id)
        if locked is None:
            raise NotFound("reservation not found")
        if reservation_state(locked) in ("released", "preempted", "ended"):
            # Nothing runs any more: its claims were (or will be) settled once, its bookings are history.
            return locked
        now = locked.db_now  # type: ignore[attr-defined]
        reservation_cut(
            reservation_id=locked.pk, at=now, now=now, pool_id=locked.pool_id, tenant_id=locked.tenant_id
        )
        locked.state = "released"
        locked.derived_state = "released"  # type: ignore[attr-defined]
        locked.released_at = now
        locked.release_reason = reason or f"released by {actor}"
        locked.save(update_fields=["state", "released_at", "release_reason"])
        # Whoever released it (a tenant through the API, an operator in the admin, the
        # lease reconciler, a node's refusal), the trail records it with the release.
        audit_record(
            actor=actor,
            action="reservation.release",
            subject_type="reservation",
            subject_id=locked.pk,
            reason=locked.release_reason,
            data={"tenantId": locked.tenant_id, "poolId": locked.pool_id},
        )
        # Delivered when this transaction commits, to creates waiting on this pool.
        notify_release(pool_id=locked.pool_id)
        released_id = locked.pk

        def tell_daemon() -> None:
            daemon_shorten(reservation_id=released_id)

        transaction.on_commit(tell_daemon)
    return locked


def reservation_renew(*, reservation: Reservation, actor: str) -> Reservation:
    """Push the lease out by its `leaseSeconds` from now; CONFLICT when there is nothing to renew."""
    with transaction.atomic():
        locked = Reservation.objects.select_for_update().get(pk=reservation.pk)
        from reservations.selectors import reservation_state

        state = reservation_state(locked)
        if not locked.lease_seconds:
            raise Conflict(
                "the reservation has no lease", [{"field": "reservationId", "message": "no lease"}]
            )
        if state not in ("scheduled", "active"):
            raise Conflict(
                f"a {state} reservation cannot be renewed", [{"field": "reservationId", "message": state}]
            )
        now = compute_now()
        locked.lease_expires_at = now + timedelta(seconds=locked.lease_seconds)
        locked.save(update_fields=["lease_expires_at"])
    return locked


def lease_expire_due(*, limit: int = 500) -> int:
    """Release live reservations whose lease passed unrenewed; return how many (a reconciler hook)."""
    released = 0
    while True:
        with transaction.atomic():
            # SKIP LOCKED: a replica (or a release) already working on a row is
            # left alone, so two reconcilers never release the same lease twice.
            due = list(
                Reservation.objects.select_for_update(skip_locked=True)
                .filter(
                    state__in=["scheduled", "active"],
                    lease_expires_at__isnull=False,
                    lease_expires_at__lte=_now_expr(),
                )
                .order_by("lease_expires_at")[:limit]
            )
            for reservation in due:
                reservation_release(reservation=reservation, actor="lease-reconciler", reason="lease expired")
        released += len(due)
        if len(due) < limit:
            return released


def _now_expr() -> Any:
    from django.db.models import DateTimeField, Func

    return Func(function="compute_now", output_field=DateTimeField())


def reservation_settle_ended(*, limit: int = 500) -> int:
    """Give back the scalars and quota of reservations that ran to their end; return how many.

    Their bookings stay as they are (history); only the claims that were held
    for the duration are returned, once (the allocations' `released` flag).
    """
    settled = 0
    while True:
        with transaction.atomic():
            now = compute_now()
            due = list(
                Reservation.objects.select_for_update(skip_locked=True)
                .filter(state__in=["scheduled", "active"], ends_at__lte=_now_expr())
                .order_by("ends_at")[:limit]
            )
            for reservation in due:
                reservation_cut(reservation_id=reservation.pk, at=reservation.ends_at, now=now)
            Reservation.objects.filter(pk__in=[r.pk for r in due]).update(state="ended")
        settled += len(due)
        if len(due) < limit:
            return settled


def reservation_deliver(*, reservation_id: str) -> bool:
    """Tell the nodes about a committed reservation; release it if a node refuses (guard 6).

    True if every node accepted.
    """
    refusal = daemon_deliver(reservation_id=reservation_id)
    if refusal is None:
        return True
    reservation = Reservation.objects.get(pk=reservation_id)
    reservation_release(reservation=reservation, actor="node", reason=f"AllocationFailed: {refusal}")
    daemon_shorten(reservation_id=reservation_id)
    return False


def reservations_redeliver(*, limit: int = 500) -> int:
    """Catch the nodes up on live reservations they lack or hold uncut; return how many were behind."""
    behind = daemon_behind(limit=limit)
    for reservation_id in behind:
        daemon_shorten(reservation_id=reservation_id)
        reservation_deliver(reservation_id=reservation_id)
    return len(behind)


def reservations_reconcile() -> None:
    """The reconciler's reservation work on each pass: due leases, ended reservations, lagging nodes."""
    lease_expire_due()
    reservation_settle_ended()
    reservations_redeliver()
