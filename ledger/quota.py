"""Quota usage (guard 5): the guarded charge, the give-back and the limits.

Only this module writes `quota_usage`. A charge is one guarded `UPDATE` whose
`WHERE` is the limit check, with a `CHECK (used <= max)` behind it; a missing
row means no limit.
"""

from __future__ import annotations

from typing import Any

from django.db import connection

from core.errors import QuotaExceeded

# Guard 5 for every resource of a placement in one statement. The UPDATE's
# WHERE clause is the limit check, re-evaluated under each row's lock, so two
# concurrent creates cannot both take the last units. `refused` lists the
# resources that have a quota row the charge did not fit in (a missing row
# means unlimited); the caller raises QUOTA_EXCEEDED and the transaction rolls
# the other charges back. `locked` takes the rows in resource order before the
# UPDATE touches them (whose join order is the planner's), so two creates or
# releases of one tenant never lock them in opposite orders.
_QUOTA_CHARGE_SQL = """
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
       AND q.used + c.amount <= q.max
    RETURNING q.resource
)
SELECT q.resource, q.used, q.max, c.amount
  FROM c JOIN quota_usage q ON q.pool_id = %(pool)s AND q.tenant_id = %(tenant)s AND q.resource = c.resource
 WHERE c.resource NOT IN (SELECT resource FROM charged)
 ORDER BY q.resource COLLATE "C"
"""


def _quota_rows_update(
    sql: str, *, pool_id: str, tenant_id: str, amounts: dict[str, int]
) -> list[tuple[Any, ...]]:
    """Run the charge or the give-back for the resources with a positive amount, in one statement.

    Answers the rows the statement returns: the charge's refusals; the
    give-back returns none. No statement when there is nothing to charge or give back.
    """
    resources = sorted(name for name, amount in amounts.items() if amount > 0)
    if not resources:
        return []
    with connection.cursor() as cursor:
        cursor.execute(
            sql,
            {
                "pool": pool_id,
                "tenant": tenant_id,
                "resources": resources,
                "amounts": [amounts[name] for name in resources],
            },
        )
        return cursor.fetchall() if cursor.description else []


def quota_charge(*, pool_id: str, tenant_id: str, charges: dict[str, int]) -> None:
    """Guard 5: charge every resource with one guarded UPDATE; a missing row means unlimited."""
    refused = _quota_rows_update(_QUOTA_CHARGE_SQL, pool_id=pool_id, tenant_id=tenant_id, amounts=charges)
    if refused:
        resource, used, limit, amount = refused[0]
        raise QuotaExceeded(
            f"quota for {resource} in this pool would be exceeded ({used} used of {limit}, {amount} asked)",
            [
                {"field": "quota", "resource": resource, "used": used, "max": limit, "asked": amount}
                for resource, used, limit, amount in refused
            ],
        )


_QUOTA_GIVE_BACK_SQL = """
WITH locked AS (
    SELECT q.id FROM quota_usage q
     WHERE q.pool_id = %(pool)s AND q.tenant_id = %(tenant)s AND q.resource = ANY(%(resources)s::varchar[])
     ORDER BY q.resource COLLATE "C"
       FOR UPDATE
)
UPDATE quota_usage q SET used = GREATEST(0, q.used - g.amount)
  FROM unnest(%(resources)s::varchar[], %(amounts)s::bigint[]) AS g(resource, amount)
 WHERE q.id IN (SELECT id FROM locked) AND q.resource = g.resource
"""


def quota_give_back(*, pool_id: str, tenant_id: str, amounts: dict[str, int]) -> None:
    """Return what a cut reservation held, never below zero, in one statement."""
    _quota_rows_update(_QUOTA_GIVE_BACK_SQL, pool_id=pool_id, tenant_id=tenant_id, amounts=amounts)


def quota_limit_set(*, pool_id: str, tenant_id: str, resource: str, limit: int) -> None:
    """Create or change a limit; a limit below what is in use is raised to it (the CHECK allows no less).

    Refusing would make a fleet reload fail while workloads run; raising it to
    `used` blocks new charges until enough is given back.
    """
    with connection.cursor() as cursor:
        cursor.execute(
            """
            INSERT INTO quota_usage (pool_id, tenant_id, resource, used, max)
            VALUES (%s, %s, %s, 0, %s)
            ON CONFLICT (pool_id, tenant_id, resource)
            DO UPDATE SET max = GREATEST(EXCLUDED.max, quota_usage.used)
            """,
            [pool_id, tenant_id, resource, limit],
        )
