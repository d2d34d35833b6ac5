"""Reservation writes: create (idempotent, optionally waiting), release, renew.

One transaction per create holds everything that belongs together: the
reservation row, its allocations and bookings, the scalar claims, the quota
charge and the rollup deltas. What talks to the outside (the node daemon,
waiting clients) runs after commit.

Waiting (`wait.timeoutMs`): a create that does not fit LISTENs on
`capacity_released` and retries when capacity in its pool frees up (a release,
a lease expiry or a settlement sends `pg_notify` inside its transaction,
delivered at commit), until the timeout. There is no sleep loop.

The nodes hear of a change through the outbox (`reservations.delivery.outbox`): the
create's INSERT and the release's UPDATE write the delivery row in the same
statement, and the worker is woken on its channel (`WORKER_CHANNEL`) by every
write that brings one of its deadlines closer: a create (its end, a lease, a
start, the delivery's retry), a renew, a delivery that failed.

A node that refuses a delivered assignment (guard 6, `assignment_refused`)
has its reservation released here: the delivery sends the signal and never
imports this module, which writes its rows. The time-driven work (lease
expiry, settling ended reservations) is `reservations.lifecycle.deadlines`'s.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from django.db import IntegrityError, connection, transaction
from django.dispatch import receiver

from core.constants import WORKER_CHANNEL
from core.errors import Conflict, IdempotencyConflict, NoCapacity, NotFound
from core.ratelimit import WriteCount
from core.retry import DEADLOCK_ATTEMPTS, deadlock_retried
from core.services import audit_params, audit_sql
from inventory.models import Pool
from reservations.delivery.daemon import AllocationFailed
from reservations.delivery.outbox import deliver_after_commit, delivery_enqueue, delivery_params, enqueue_sql
from reservations.delivery.signals import assignment_refused
from reservations.models import DeliveryKind, Reservation
from reservations.placer.commit import OBSERVERS, placement_charge, placement_commit
from reservations.placer.cut import reservation_cut
from reservations.placer.option import PlacementRestart
from reservations.placer.plan import placement_window
from reservations.request.parse import canonical_request_digest
from reservations.request.resolve import reservation_request_check
from reservations.request.types import ReservationRequest
from reservations.selectors import allocations_json_sql
from reservations.waits import LISTENER, RELEASE_CHANNEL, wait_for_release, wait_slot

logger = logging.getLogger(__name__)

RELEASE_ATTEMPTS = DEADLOCK_ATTEMPTS
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


# The reservation's INSERT also reads the transaction's clock (its window is
# computed from it here, the same rule as `placement_window`, which checks it
# next), writes its "assign" outbox row and wakes the worker with its nearest
# new deadline (a lease, the start, the end, or the delivery's retry), all in one
# statement. When the idempotency key is taken (ON CONFLICT DO NOTHING), `r` is
# empty: no row, no delivery, no notification.
_INSERT_RESERVATION_SQL = f"""
WITH clock AS MATERIALIZED (
    SELECT compute_now() AS now
), t AS (
    SELECT now, GREATEST(COALESCE(%(asked_start)s::timestamptz, now), now) AS starts_at FROM clock
), r AS (
    INSERT INTO reservations_reservation (id, tenant_id, pool_id, project_id, request, request_digest,
        idempotency_key, spot, binding, starts_at, ends_at, state, lease_seconds, lease_expires_at,
        release_reason, at_risk_reason, created_at)
    SELECT %(id)s, %(tenant_id)s, %(pool_id)s, %(project_id)s, %(request)s::jsonb, %(request_digest)s,
        %(idempotency_key)s, %(spot)s, %(binding)s, t.starts_at,
        t.starts_at + make_interval(secs => %(duration)s),
        CASE WHEN t.starts_at <= t.now THEN 'active' ELSE 'scheduled' END, %(lease_seconds)s,
        CASE WHEN COALESCE(%(lease_seconds)s::int, 0) > 0
             THEN t.now + make_interval(secs => %(lease_seconds)s) END,
        '', '', t.now
      FROM t
    ON CONFLICT (tenant_id, idempotency_key) DO NOTHING
    RETURNING id, created_at, starts_at, ends_at, state, lease_expires_at
), delivery AS (
    {enqueue_sql(source="r", kind=DeliveryKind.ASSIGN)}
)
SELECT r.created_at, r.starts_at, r.ends_at, r.state, r.lease_expires_at,
       pg_notify(%(worker_channel)s, to_json(LEAST(
           r.lease_expires_at, r.ends_at, CASE WHEN r.starts_at > r.created_at THEN r.starts_at END,
           delivery.next_attempt_at)) #>> '{{}}')
  FROM r, delivery
"""


def _insert_params(reservation: Reservation, request: ReservationRequest) -> dict[str, Any]:
    asked = None
    if request.start_ms is not None:
        asked = datetime.fromtimestamp(request.start_ms / 1000, tz=UTC)
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
        "asked_start": asked,
        "duration": float(request.duration_seconds),
        "lease_seconds": reservation.lease_seconds,
        "worker_channel": WORKER_CHANNEL,
        **delivery_params(),
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


@deadlock_retried
def _create(*, request: ReservationRequest, digest: str, actor: str, pool: Pool) -> ReservationCreated:
    """One create, savepoint-free first; once more, careful (savepoints), if that lost a race after writing.

    The restart rolls the first run back whole (the reservation row included),
    so what the second run writes is all there is. So does a lost deadlock
    (a node or maintenance change met between two of the placement's node
    locks), after which the whole create runs again.
    """
    try:
        return _create_once(request=request, digest=digest, actor=actor, pool=pool, careful=False)
    except PlacementRestart as restart:
        logger.info("create restarted, careful: %s", restart)
        # A replan, for who counts them (the metrics); its second placement is observed too.
        for observer in list(OBSERVERS):
            observer("replan", 0.0)
        return _create_once(request=request, digest=digest, actor=actor, pool=pool, careful=True)


def _create_once(
    *, request: ReservationRequest, digest: str, actor: str, pool: Pool, careful: bool = True
) -> ReservationCreated:
    with transaction.atomic():
        reservation = Reservation(
            tenant_id=request.tenant_id,
            pool_id=request.pool_id,
            project_id=request.project_id,
            request=request.raw,
            request_digest=digest,
            idempotency_key=request.idempotency_key,
            spot=request.spot,
            binding=request.binding,
            lease_seconds=request.lease_seconds,
        )
        # The unique (tenant, idempotency_key) index decides a race of two
        # identical creates: the second INSERT waits for the first transaction
        # and, if it committed, inserts nothing (no error, so no savepoint is
        # needed around it); the winner's reservation is then answered. A replay
        # is answered so too, whatever its start has become since.
        with connection.cursor() as cursor:
            cursor.execute(_INSERT_RESERVATION_SQL, _insert_params(reservation, request))
            inserted = cursor.fetchone()
        if inserted is None:
            existing = _existing(request)
            if existing is None:  # pragma: no cover - the winner committed, so it is visible
                raise IntegrityError(f"{IDEMPOTENCY_CONSTRAINT}: the winning create is not visible")
            return ReservationCreated(reservation=_same_or_conflict(existing, digest), created=False)
        now, starts_at, ends_at, state, lease_expires_at, _ = inserted
        # The start's rules (not too far in the past, within the horizon): a refusal rolls the row back.
        window = placement_window(request=request, now=now)
        if (window.start, window.end) != (starts_at, ends_at):  # pragma: no cover - one rule, written twice
            raise AssertionError(
                f"the reservation's window {starts_at}..{ends_at} is not the placer's {window}"
            )
        reservation.created_at = now
        reservation.starts_at, reservation.ends_at, reservation.state = starts_at, ends_at, state
        reservation.lease_expires_at = lease_expires_at
        reservation._state.adding = False

        placement = placement_commit(
            reservation=reservation, request=request, pool=pool, window=window, careful=careful
        )
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
        # Spot reservations cut to make room hear of it first (their rows' on-commit
        # deliveries are registered before this one's).
        for spot_id in placement.displaced_reservations:
            delivery_enqueue(reservation_id=spot_id, kind=DeliveryKind.SHORTEN)

        # Once committed (after the response, inside a request); a node that cannot be told
        # then is told by the worker from the outbox: it never turns a made reservation into an error.
        deliver_after_commit(reservation_id=reservation_id)
    return ReservationCreated(reservation=reservation, created=True, allocations=allocations)


def reservation_create(
    *, request: ReservationRequest, actor: str, pool: Pool | None = None
) -> ReservationCreated:
    """Place and book the request; return the reservation and whether it was created now.

    Idempotent per (tenant, idempotencyKey): the same request returns the same
    reservation, a different one raises `IdempotencyConflict`.

    `pool` is the pool of a `reservations.request.resolve.ResolvedRequest` (the
    API's view): the request was checked against it, pool, project and sharing
    mode, and is not checked again here. Without it (the CLI, scripts, tests)
    the request goes through `reservation_request_check`, the same checks
    without a principal.
    """
    if pool is None:
        resolved = reservation_request_check(request)
        request, pool = resolved.request, resolved.pool
    elif pool.pk != request.pool_id:
        raise ValueError(f"the resolved pool {pool.pk} is not the request's pool {request.pool_id}")
    digest = request_digest(request)
    # No look-up first: the reservation's INSERT meets an earlier create with the key
    # (`ON CONFLICT ... DO NOTHING`) and `_create_once` answers that one.
    # Waiting needs notifications, which arrive only between transactions: a
    # caller that already holds a transaction gets one attempt.
    can_wait = request.wait_timeout_ms > 0 and not connection.in_atomic_block
    deadline = time.monotonic() + request.wait_timeout_ms / 1000
    try:
        return _create(request=request, digest=digest, actor=actor, pool=pool)
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
                return _create(request=request, digest=digest, actor=actor, pool=pool)
            except NoCapacity:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise
                wait_for_release(event=released, seconds=remaining)


def reservation_release(
    *,
    reservation: Reservation,
    actor: str,
    reason: str = "",
    tenant_id: str | None = None,
    rate: WriteCount | None = None,
) -> Reservation:
    """End the reservation now: running bookings end at `compute_now()`, future ones are deleted.

    Scalars, quota and rollup counts are given back once; releasing twice is
    harmless. Only `reservation.pk` is read; see `reservation_release_id`.
    """
    return reservation_release_id(
        reservation_id=reservation.pk, actor=actor, reason=reason, tenant_id=tenant_id, rate=rate
    )


def reservation_release_id(
    *,
    reservation_id: str,
    actor: str,
    reason: str = "",
    tenant_id: str | None = None,
    rate: WriteCount | None = None,
) -> Reservation:
    """`reservation_release` by id, as the API has it (making a model to carry an id cost 30 µs).

    With `tenant_id`, another tenant's reservation is NOT_FOUND. `rate`: the
    API's write count, made in the release's last statement
    (`core.ratelimit.write_counted`); past a limit, the release rolls back.
    """
    return _release_once(
        reservation_id=reservation_id, actor=actor, reason=reason, tenant_id=tenant_id, rate=rate
    )


def _release_sql(*, counted: bool) -> str:
    """The release's last statement; `counted`: with the write's rate count (`core.ratelimit.WriteCount`)."""
    rate_cte = f"{WriteCount.cte}, " if counted else ""
    rate_column = f",\n       {WriteCount.column}" if counted else ""
    return f"""
WITH {rate_cte}released AS (
    UPDATE reservations_reservation
       SET state = 'released', released_at = %(released_at)s, release_reason = %(reason)s
     WHERE id = %(id)s
    RETURNING id, pool_id
), delivery AS (
    {enqueue_sql(source="released", kind=DeliveryKind.SHORTEN)}
), audit AS (
    {audit_sql(source="released", action="reservation.release", subject_type="reservation")}
)
SELECT pg_notify(%(release_channel)s, released.pool_id),
       pg_notify(%(worker_channel)s, to_json(delivery.next_attempt_at) #>> '{{}}'),
       {allocations_json_sql("released.id")}{rate_column}
  FROM released, delivery, audit
"""


_RELEASE_SQL = _release_sql(counted=False)
_RELEASE_COUNTED_SQL = _release_sql(counted=True)


# A gang placement can hold one node's scalar row while it waits for this release's
# bookings; PostgreSQL breaks that cycle by failing one side. A release is safe to run
# again from the start.
@deadlock_retried
def _release_once(
    *, reservation_id: str, actor: str, reason: str, tenant_id: str | None, rate: WriteCount | None
) -> Reservation:
    from reservations.selectors import reservation_lock, reservation_state

    if rate is not None:
        rate.begin()
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
        # One statement: the row, its "shorten" outbox row, its audit event (whoever released
        # it: a tenant through the API, an operator in the admin, the lease expiry, a node's
        # refusal) and the notifications sent at commit (creates waiting on this pool; the
        # worker, of the delivery's retry), and the API's write count.
        with connection.cursor() as cursor:
            cursor.execute(
                _RELEASE_SQL if rate is None else _RELEASE_COUNTED_SQL,
                {
                    "id": locked.pk,
                    "released_at": now,
                    "reason": locked.release_reason,
                    "release_channel": RELEASE_CHANNEL,
                    "worker_channel": WORKER_CHANNEL,
                    **delivery_params(),
                    **audit_params(
                        actor=actor,
                        reason=locked.release_reason,
                        data={"tenantId": locked.tenant_id, "poolId": locked.pool_id},
                    ),
                    **(rate.params() if rate is not None else {}),
                },
            )
            # The answer, read in the same statement: the allocations as the cut left them.
            row = cursor.fetchone()
        assert row is not None
        if rate is not None:
            rate.check(row[3])  # past a limit: TooManyRequests, and the release rolls back
        locked.allocations_json = row[2]  # type: ignore[attr-defined]
        released_id = locked.pk
        deliver_after_commit(reservation_id=released_id)
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
        # The new deadline, and the worker woken to sleep until it, in one statement.
        with connection.cursor() as cursor:
            cursor.execute(
                "UPDATE reservations_reservation"
                " SET lease_expires_at = compute_now() + make_interval(secs => lease_seconds)"
                " WHERE id = %s RETURNING lease_expires_at,"
                " pg_notify(%s, to_json(lease_expires_at) #>> '{}')",
                [locked.pk, WORKER_CHANNEL],
            )
            row = cursor.fetchone()
        assert row is not None
        locked.lease_expires_at = row[0]
    return locked


@receiver(assignment_refused, sender=Reservation, dispatch_uid="reservations.services.release_refused")
def release_refused(*, reservation_id: str, refusal: AllocationFailed, **_: Any) -> None:
    """Guard 6: a node refused the reservation's assignment, so it is released (by "node")."""
    reservation = Reservation.objects.get(pk=reservation_id)
    reservation_release(reservation=reservation, actor="node", reason=f"AllocationFailed: {refusal}")
