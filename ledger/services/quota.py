"""Quota usage (guard 5): the guarded charge, the give-back and the limits.

Only this module writes `quota_usage` (the offering services of
`ledger.services.offerings` call it). A charge is one guarded `UPDATE` whose `WHERE` is
the limit check, with a `CHECK (used <= max)` behind it; a missing row means
no limit.

A `concurrent` row (`QuotaMode`) limits the peak of use over time instead of
the sum: the same `UPDATE` takes its lock and adds to its `used` unchecked,
and the charge then asks the caller for the peak over the new reservation's
window (the holdings are the reservations' rows, read by the layer that owns
them) and refuses above the limit. The row lock serializes those checks.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from django.db import connection

from core.errors import Conflict, QuotaExceeded
from ledger.models import QuotaMode, QuotaUsage

# Another owner's write run in the same statement as a charge or a give-back, so it costs
# no round trip of its own: its CTEs (`name AS (...)`, comma-separated, none read by this
# module's SQL) and their parameters (named apart from this module's: pool, tenant,
# resources, amounts). PostgreSQL runs a data-modifying CTE the main query does not read
# after the main query, so the quota rows are locked first (and held while the piggyback
# waits for its rows), as in two statements.
Piggyback = tuple[str, dict[str, Any]]

# The charge's question for `concurrent` rows: given the resources, the tenant's
# peak use of each over the new reservation's window, its own holdings included.
WindowPeaks = Callable[[Sequence[str]], Mapping[str, int]]

# Guard 5 for every resource of a placement in one statement. The UPDATE's
# WHERE clause is the limit check, re-evaluated under each row's lock, so two
# concurrent creates cannot both take the last units. `refused` lists the
# resources that have a quota row the charge did not fit in (a missing row
# means unlimited); the caller raises QUOTA_EXCEEDED and the transaction rolls
# the other charges back. `locked` takes the rows in resource order before the
# UPDATE touches them (whose join order is the planner's), so two creates or
# releases of one tenant never lock them in opposite orders.
#
# A `concurrent` row is charged without the `used` check (its limit is on the
# peak over time, not on the sum) and comes back flagged, with its limit, so
# the caller checks the peak next, while this statement's lock is held. A
# counter-only charge returns no such row: its cost stays this one statement.
_QUOTA_CHARGE_SQL = f"""
WITH c AS (
    SELECT resource, amount
      FROM unnest(%(resources)s::varchar[], %(amounts)s::bigint[]) AS c(resource, amount)
),
locked AS (
    SELECT q.id FROM quota_usage q
     WHERE q.pool_id = %(pool)s AND q.tenant_id = %(tenant)s AND q.resource = ANY(%(resources)s::varchar[])
     ORDER BY q.resource COLLATE "C"
       FOR UPDATE
),
charged AS (
    UPDATE quota_usage q SET used = q.used + c.amount
      FROM c
     WHERE q.id IN (SELECT id FROM locked) AND q.resource = c.resource
       AND (q.mode = '{QuotaMode.CONCURRENT}' OR q.used + c.amount <= q.max)
    RETURNING q.resource, q.mode, q.max, c.amount
){{piggyback}}
SELECT * FROM (
    SELECT q.resource, q.used, q.max, c.amount, false AS concurrent
      FROM c JOIN quota_usage q
        ON q.pool_id = %(pool)s AND q.tenant_id = %(tenant)s AND q.resource = c.resource
     WHERE c.resource NOT IN (SELECT resource FROM charged)
    UNION ALL
    SELECT resource, NULL, max, amount, true FROM charged WHERE mode = '{QuotaMode.CONCURRENT}'
) rows
 ORDER BY resource COLLATE "C"
"""


def _quota_rows_update(
    sql: str, *, pool_id: str, tenant_id: str, amounts: dict[str, int], piggyback: Piggyback | None = None
) -> list[tuple[Any, ...]]:
    """Run the charge or the give-back for the resources with a positive amount, in one statement.

    Answers the rows the statement returns: the charge's refusals and its
    `concurrent` rows; the give-back returns none. With nothing to charge or
    give back, only the `piggyback` runs (or no statement at all).
    """
    resources = sorted(name for name, amount in amounts.items() if amount > 0)
    if not resources:
        if piggyback is not None:
            with connection.cursor() as cursor:
                cursor.execute(f"WITH {piggyback[0]} SELECT 1", piggyback[1])
        return []
    ctes, extra = piggyback if piggyback is not None else ("", {})
    with connection.cursor() as cursor:
        cursor.execute(
            # After this module's CTEs: the statement's text (as pg_stat_activity shows its
            # first kilobyte) starts with the quota's own.
            sql.replace("{piggyback}", f",\n{ctes}" if ctes else ""),
            {
                **extra,
                "pool": pool_id,
                "tenant": tenant_id,
                "resources": resources,
                "amounts": [amounts[name] for name in resources],
            },
        )
        return cursor.fetchall() if cursor.description else []


def quota_charge(
    *,
    pool_id: str,
    tenant_id: str,
    charges: dict[str, int],
    window_peaks: WindowPeaks,
    piggyback: Piggyback | None = None,
) -> None:
    """Guard 5: charge every resource with one guarded UPDATE; a missing row means unlimited.

    `piggyback` runs in the same statement (its writes roll back with the
    transaction a refusal aborts).

    `window_peaks` is called only when a charged row is `concurrent`, after the
    UPDATE has locked it: READ COMMITTED gives its statement a fresh snapshot,
    so it sees the holdings of every charge that held the lock before this one
    (and this transaction's own). A peak above the limit refuses the charge as
    a counter's would, `used` being the peak without this reservation.
    """
    rows = _quota_rows_update(
        _QUOTA_CHARGE_SQL, pool_id=pool_id, tenant_id=tenant_id, amounts=charges, piggyback=piggyback
    )
    refused = [
        (resource, used, limit, amount, "used")
        for resource, used, limit, amount, flagged in rows
        if not flagged
    ]
    concurrent = {resource: (limit, amount) for resource, _used, limit, amount, flagged in rows if flagged}
    if concurrent and not refused:
        peaks = window_peaks(sorted(concurrent))
        for resource, (limit, amount) in sorted(concurrent.items()):
            peak = int(peaks.get(resource, 0))
            if peak > limit:
                # The new reservation holds `amount` over its whole window: the rest peak at `peak - amount`.
                refused.append(
                    (resource, peak - amount, limit, amount, "in use at the busiest instant of the window")
                )
    if refused:
        resource, used, limit, amount, how = refused[0]
        raise QuotaExceeded(
            f"quota for {resource} in this pool would be exceeded ({used} {how} of {limit}, {amount} asked)",
            [
                {
                    "field": "quota",
                    "message": f"{resource}: {used} {how}, a limit of {limit}, {amount} asked",
                    "resource": resource,
                    "used": used,
                    "max": limit,
                    "asked": amount,
                }
                for resource, used, limit, amount, how in refused
            ],
        )


_QUOTA_GIVE_BACK_SQL = """
WITH locked AS (
    SELECT q.id FROM quota_usage q
     WHERE q.pool_id = %(pool)s AND q.tenant_id = %(tenant)s AND q.resource = ANY(%(resources)s::varchar[])
     ORDER BY q.resource COLLATE "C"
       FOR UPDATE
){piggyback}
UPDATE quota_usage q SET used = GREATEST(0, q.used - g.amount)
  FROM unnest(%(resources)s::varchar[], %(amounts)s::bigint[]) AS g(resource, amount)
 WHERE q.id IN (SELECT id FROM locked) AND q.resource = g.resource
"""


def quota_give_back(
    *, pool_id: str, tenant_id: str, amounts: dict[str, int], piggyback: Piggyback | None = None
) -> None:
    """Return what a cut reservation held, never below zero, in one statement (both modes keep `used`)."""
    _quota_rows_update(
        _QUOTA_GIVE_BACK_SQL, pool_id=pool_id, tenant_id=tenant_id, amounts=amounts, piggyback=piggyback
    )


def quota_limit_set(
    *, pool_id: str, tenant_id: str, resource: str, limit: int, mode: str | None = None
) -> None:
    """Create or change a limit; a counter limit below its `used` is raised to it (the CHECK allows no less).

    Refusing would make a fleet reload fail while workloads run; raising it to
    `used` blocks new charges until enough is given back. A `concurrent` limit
    is stored as given: reservations already held stay, and a new one is
    refused while the peak over its window is above the limit. `mode` None
    keeps the row's mode (`counter` for a new row); switching to `counter`
    raises the limit to `used` like any counter limit.
    """
    if mode is not None and mode not in QuotaMode.values:
        raise ValueError(f"unknown quota mode {mode!r}")
    with connection.cursor() as cursor:
        cursor.execute(
            f"""
            INSERT INTO quota_usage (pool_id, tenant_id, resource, used, max, mode)
            VALUES (%(pool)s, %(tenant)s, %(resource)s, 0, %(limit)s,
                    COALESCE(%(mode)s, '{QuotaMode.COUNTER}'))
            ON CONFLICT (pool_id, tenant_id, resource)
            DO UPDATE SET mode = COALESCE(%(mode)s, quota_usage.mode),
                          max = CASE WHEN COALESCE(%(mode)s, quota_usage.mode) = '{QuotaMode.CONCURRENT}'
                                     THEN EXCLUDED.max
                                     ELSE GREATEST(EXCLUDED.max, quota_usage.used) END
            """,
            {"pool": pool_id, "tenant": tenant_id, "resource": resource, "limit": limit, "mode": mode},
        )


def quota_limits_apply(
    *,
    pool_id: str,
    tenant_id: str,
    limits: dict[str, int | None],
    mode: str | None,
    refuse_below_use: bool,
) -> None:
    """Set (or, for None, remove) several limits of one offering together, under the rows' locks.

    The rows are locked `FOR UPDATE` in resource order, as a charge locks
    them, so no charge slips between the check and the write. With
    `refuse_below_use` (the API), a counter limit below what is in use
    refuses the whole change (CONFLICT) and nothing is written; without it (a
    fleet reload) such a limit is raised to the use, as `quota_limit_set` does.
    A concurrent limit is always stored as given.
    """
    if mode is not None and mode not in QuotaMode.values:
        raise ValueError(f"unknown quota mode {mode!r}")
    rows = {
        row.resource: row
        for row in QuotaUsage.objects.select_for_update()
        .filter(pool_id=pool_id, tenant_id=tenant_id)
        .order_by("resource")
    }
    if refuse_below_use:
        # Every row the change leaves as a counter: the named ones at their new limit, the others
        # (switched by `mode`) at the limit they keep.
        wanted = {resource: row.max for resource, row in rows.items()} | limits
        below = [
            {
                "field": f"quota.{resource}",
                "message": f"{rows[resource].used} in use, above a limit of {limit}",
                "resource": resource,
                "used": rows[resource].used,
                "max": limit,
            }
            for resource, limit in sorted(wanted.items())
            if limit is not None
            and resource in rows
            and (mode or rows[resource].mode) == QuotaMode.COUNTER
            and limit < rows[resource].used
        ]
        if below:
            first = below[0]
            raise Conflict(
                f"quota for {first['resource']}: {first['used']} in use, a limit of {first['max']} would be"
                " below it; release reservations first, or use the concurrent mode",
                below,
            )
    for resource, limit in sorted(limits.items()):
        if limit is None:
            QuotaUsage.objects.filter(pool_id=pool_id, tenant_id=tenant_id, resource=resource).delete()
        else:
            quota_limit_set(pool_id=pool_id, tenant_id=tenant_id, resource=resource, limit=limit, mode=mode)
    if mode is not None:
        # The mode is the offering's: rows the change did not name follow it too.
        for resource, row in rows.items():
            if resource not in limits:
                quota_limit_set(
                    pool_id=pool_id, tenant_id=tenant_id, resource=resource, limit=row.max, mode=mode
                )


def quota_rows_lock(*, pool_id: str, tenant_id: str) -> None:
    """Lock one offering's quota rows `FOR UPDATE` in resource order, as a charge does."""
    list(
        QuotaUsage.objects.select_for_update()
        .filter(pool_id=pool_id, tenant_id=tenant_id)
        .order_by("resource")
        .values_list("id", flat=True)
    )


def quota_rows_remove(*, pool_id: str, tenant_id: str) -> None:
    """Remove every limit of one offering (it was withdrawn)."""
    QuotaUsage.objects.filter(pool_id=pool_id, tenant_id=tenant_id).delete()
