"""The placer's answers on a request, nothing written: preview (now?), explain (why not?), earliest (when?).

Each takes a resolved request (`reservations.request.resolve`) and asks the
placer's read-only planning (`reservations.placer`) for the contract's shape.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from core.errors import NotFound
from inventory.models import Pool
from reservations.request.types import ReservationRequest


def _spot_reservations_displaced(*, device_ids: list[int], start: datetime, end: datetime) -> int:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(DISTINCT r.id) FROM device_bookings b"
            " JOIN reservations_allocation a ON a.id = b.allocation_id"
            " JOIN reservations_reservation r ON r.id = a.reservation_id"
            " WHERE b.device_id = ANY(%s) AND b.during && tstzrange(%s, %s, '[)') AND r.spot",
            [device_ids, start, end],
        )
        row = cursor.fetchone()
    return int(row[0]) if row else 0


def _plan_candidates(*, request: ReservationRequest, plan: Any) -> list[dict[str, Any]]:
    """A plan's options as preview answers them: one per node, or the best gang's members."""
    if not plan.fits:
        return []
    members = plan.options[0].members if request.gang_size else [o.members[0] for o in plan.options]
    return [{"nodeId": m.node_id, "atoms": list(m.atoms), "score": m.score} for m in members]


def capacity_preview(*, request: ReservationRequest, pool: Pool) -> dict[str, Any]:
    """What `reservations/create` would do now, without writing anything or checking quota.

    Up to 10 ranked candidates (one per node), or the members of the best gang;
    with `binding: node` the whole nodes. A regular request that fits only by
    displacing spot reservations gets `preemptible`: how many would get a
    notice and when it would start, a count and never their ids.

    `request` and `pool` are a `reservations.request.resolve.ResolvedRequest`'s (or
    the CLI's, which builds the class from the pool): nothing is checked here.
    """
    from core.clock import to_millis
    from reservations.placer.plan import placement_window, plan_for_preview

    window = placement_window(request=request)
    plan, displacing = plan_for_preview(request=request, pool=pool, window=window)
    candidates = _plan_candidates(request=request, plan=plan)
    preemptible = None
    if displacing is not None and displacing.fits:
        best = displacing.options[0]
        count = _spot_reservations_displaced(
            device_ids=[i for m in best.members for i in m.device_ids],
            start=displacing.window.start,
            end=displacing.window.end,
        )
        preemptible = {"count": count, "startsAt": to_millis(displacing.window.start)}
    reason = None
    if plan.reason is not None and not plan.fits:
        reason = {"code": plan.reason.code, "message": plan.reason.message}
    return {
        "fits": plan.fits,
        "start": to_millis(plan.window.start),
        "end": to_millis(plan.window.end),
        "candidates": candidates,
        "reason": reason,
        "preemptible": preemptible,
    }


def capacity_explain(
    *, request: ReservationRequest, pool: Pool, node_id: str | None = None
) -> dict[str, Any]:
    """`capacity/explain`: per filter of the placer, the nodes it removes and why, with the preview.

    `node_id` narrows it to one node of the pool (NOT_FOUND for any other).
    The reasons name atoms, counts and times only (`reservations.placer.explain`).
    """
    from inventory.models import Node
    from reservations.placer.explain import placement_explain
    from reservations.placer.plan import placement_window

    if node_id is not None and not Node.objects.filter(pk=node_id, pool_id=pool.pk).exists():
        raise NotFound("node not found in the pool")
    window = placement_window(request=request)
    return {
        **placement_explain(request=request, window=window, node_id=node_id),
        "preview": capacity_preview(request=request, pool=pool),
    }


def capacity_earliest(
    *, request: ReservationRequest, pool: Pool, from_ms: int | None, horizon_seconds: int
) -> dict[str, Any]:
    """`capacity/earliest`: the first start from `from_ms` on, within the horizon, where the request fits.

    The answer is a preview at that start (`candidates` as capacity.preview's),
    or the reason nothing in the horizon fits. Starts past the
    `CAPACITY_MAX_START_AHEAD` horizon are not searched, since a create could
    not ask for them.
    """
    from datetime import UTC, timedelta

    from core.clock import compute_now, to_millis
    from reservations.placer.earliest import placement_earliest
    from reservations.request.types import start_horizon_seconds

    now = compute_now()
    start = now if from_ms is None else max(now, datetime.fromtimestamp(from_ms / 1000, tz=UTC))
    until = min(start + timedelta(seconds=horizon_seconds), now + timedelta(seconds=start_horizon_seconds()))
    found = placement_earliest(request=request, pool=pool, start=start, until=until, now=now)
    candidates: list[dict[str, Any]] = []
    start_ms = end_ms = None
    reason = None
    if found.plan is not None and found.plan.fits:
        plan = found.plan
        candidates = _plan_candidates(request=request, plan=plan)
        start_ms, end_ms = to_millis(plan.window.start), to_millis(plan.window.end)
    elif found.reason is not None:
        reason = {"code": found.reason.code, "message": found.reason.message}
    return {
        "fits": found.fits,
        "start": start_ms,
        "end": end_ms,
        "candidates": candidates,
        "reason": reason,
        "searchedFrom": to_millis(found.searched_from),
        "searchedTo": to_millis(found.searched_to),
        "instantsTried": found.tried,
    }
