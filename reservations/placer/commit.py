"""The commit: turn a plan into allocations and bookings, inside the request's transaction.

The shortlist's options are tried in order (`reservations.placer.option`:
all members or none, each guarded); when every one lost its race, the placer
replans a bounded number of times, then answers `NoCapacity`. A regular
request that fits nowhere is planned once more in displace mode.

The quota charge (guard 5) and the rollup deltas run in the same transaction
(`placement_charge`). Ending bookings is `reservations.placer.cut`'s, and the
notice a displacing option gives spot reservations `reservations.placer.notice`'s.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

from core.errors import NoCapacity
from inventory.choices import SCALAR_RESOURCES
from inventory.models import Pool
from ledger.services.quota import quota_charge
from reservations.models import Allocation, Reservation
from reservations.placer.filters import Window
from reservations.placer.option import try_option
from reservations.placer.plan import Member, Plan, placement_plan
from reservations.request.types import ReservationRequest
from reservations.rollups.deltas import rollup_deltas_piggyback
from reservations.selectors import holdings_peaks

logger = logging.getLogger(__name__)

# How many times a spent shortlist is replanned before NoCapacity.
MAX_REPLANS = 3

# Told of each placement, as (event, seconds): ("placement", its time) once per create, fitted or
# not, and ("replan", 0.0) per spent shortlist planned again. The metrics listen (operations.metrics),
# so the placer knows nothing of who counts.
OBSERVERS: list[Callable[[str, float], None]] = []


@dataclass
class Placement:
    """What a commit took: the (possibly displaced) window and one allocation per member."""

    window: Window
    allocations: list[tuple[Allocation, Member]]
    displaced_reservations: list[str]


def plan_commit(
    *, reservation: Reservation, request: ReservationRequest, plan: Plan, window: Window, careful: bool = True
) -> Placement | None:
    """Book the first option of `plan` that still holds; None when every one lost its race.

    `window` is the request's own (`placement_window`); a displace-mode plan's
    window is the displaced one, taken only by an option that displaces a spot
    booking (`reservations.placer.option.try_option`).
    """
    displaced = plan.window if plan.displace else None
    for option in plan.options:
        taken = try_option(
            reservation=reservation,
            request=request,
            option=option,
            window=window,
            displaced=displaced,
            careful=careful,
        )
        if taken is not None:
            allocations, cut, chosen = taken
            return Placement(window=chosen, allocations=allocations, displaced_reservations=cut)
    return None


def placement_commit(
    *, reservation: Reservation, request: ReservationRequest, pool: Pool, window: Window, careful: bool = True
) -> Placement:
    """Book the best option that still holds, replanning when a shortlist is spent; else NoCapacity.

    A regular request that fits nowhere is planned once more in displace mode:
    it then starts when the spot notice ends and the spot reservations it takes
    atoms from are cut to end then. Not `careful`, an option is booked without a
    savepoint, and a race lost after writing raises `PlacementRestart`: the
    caller rolls its transaction back and runs once more, careful.
    """
    started = time.perf_counter()
    try:
        return _placement_commit(
            reservation=reservation, request=request, pool=pool, window=window, careful=careful
        )
    finally:
        _observe("placement", time.perf_counter() - started)


def _observe(event: str, seconds: float) -> None:
    for observer in list(OBSERVERS):
        observer(event, seconds)


def _placement_commit(
    *, reservation: Reservation, request: ReservationRequest, pool: Pool, window: Window, careful: bool
) -> Placement:
    modes = (False,) if request.spot else (False, True)
    reason = None
    for displace in modes:
        for attempt in range(MAX_REPLANS + 1):
            if attempt:
                logger.info("placement replan %d for pool %s", attempt, request.pool_id)
                _observe("replan", 0.0)
            plan = placement_plan(request=request, pool=pool, window=window, displace=displace)
            if not plan.fits:
                reason = plan.reason
                break
            placement = plan_commit(
                reservation=reservation, request=request, plan=plan, window=window, careful=careful
            )
            if placement is not None:
                return placement
            reason = plan.reason
    details: list[dict[str, Any]] = []
    message = "the request does not fit"
    if reason is not None:
        details = [{"field": "placement", "code": reason.code, "message": reason.message}]
        message = reason.message
    raise NoCapacity(message, details)


def placement_charges(placement: Placement) -> dict[str, int]:
    """What the placement takes from the tenant's quota: atoms per class, scalars per node."""
    charges: Counter[str] = Counter()
    for allocation, member in placement.allocations:
        charges.update(member.classes)
        for resource, amount in allocation.resources.items():
            charges[resource] += int(amount)
    return dict(charges)


def placement_charge(*, placement: Placement, request: ReservationRequest) -> None:
    """Quota and rollup deltas for a committed placement, in the same transaction (one statement).

    A `concurrent` quota adds one statement: the tenant's peak over the
    placement's window (the displaced one when it displaced spot bookings),
    read after the quota row is locked (`ledger.services.quota.quota_charge`).
    """
    charges = placement_charges(placement)
    tenant_id, pool_id, window = request.tenant_id, request.pool_id, placement.window
    # The ledger calls it with the resources to read: straight into the holdings, not back into the placer.
    peaks = partial(holdings_peaks, tenant_id=tenant_id, pool_id=pool_id, start=window.start, end=window.end)
    # The rollup deltas ride in the charge's statement: one round trip for both.
    rollups = rollup_deltas_piggyback(pool_id=pool_id, deltas=placement_deltas(placement, charges))
    quota_charge(pool_id=pool_id, tenant_id=tenant_id, charges=charges, window_peaks=peaks, piggyback=rollups)


def placement_deltas(
    placement: Placement, charges: dict[str, int] | None = None
) -> dict[str, tuple[int, int]]:
    """The rollup deltas of a committed placement's charges: `(allocated, reserved)` per resource.

    The bookings' insert trigger set their phase from the same clock (this
    transaction's compute_now(), which `window.now` is): allocated (RUNNING)
    if started, else reserved (FUTURE). Scalars are claimed from
    node_resources at once, whatever the start: allocated.
    """
    started = placement.window.start <= placement.window.now
    return {
        resource: (amount, 0) if resource in SCALAR_RESOURCES or started else (0, amount)
        for resource, amount in (placement_charges(placement) if charges is None else charges).items()
    }
