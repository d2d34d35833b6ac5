"""Ledger reads: an offering, the offerings of a tenant or a pool with their limits, quota rows."""

from __future__ import annotations

from typing import Any

from core.errors import NotFound
from ledger.models import Offering, QuotaUsage


def offering_find(*, pool_id: str, tenant_id: str) -> Offering:
    """The offering of the pool to the tenant, or NOT_FOUND."""
    offering = Offering.objects.filter(pool_id=pool_id, tenant_id=tenant_id).first()
    if offering is None:
        raise NotFound("offering not found")
    return offering


def offering_limits(pool_id: str, tenant_id: str) -> dict[str, list[Any]]:
    """The tenant's limits on the pool per resource (`[max, mode]`); an update is audited when they change."""
    rows = QuotaUsage.objects.filter(pool_id=pool_id, tenant_id=tenant_id).order_by("resource")
    return {row.resource: [row.max, row.mode] for row in rows}


def offerings_list(*, tenant_id: str | None = None, pool_id: str | None = None) -> list[Offering]:
    """Offerings in (pool, tenant) order, of one tenant or one pool or all; the pools read with them.

    A tenant's own list leaves out archived pools: an archived pool is
    visible to its owner only, and an offering is never to the owner.
    """
    offerings = Offering.objects.select_related("pool").order_by("pool_id", "tenant_id")
    if tenant_id is not None:
        offerings = offerings.filter(tenant_id=tenant_id, pool__archived_at__isnull=True)
    if pool_id is not None:
        offerings = offerings.filter(pool_id=pool_id)
    return list(offerings[:1000])


def offerings_payload(offerings: list[Offering]) -> list[dict[str, Any]]:
    """Offerings as the API answers them, each with its quota rows (one query per pool)."""
    by_pool: dict[str, list[str]] = {}
    for offering in offerings:
        by_pool.setdefault(offering.pool_id, []).append(offering.tenant_id)
    rows = {pool_id: quota_rows(pool_id=pool_id, tenant_ids=tenants) for pool_id, tenants in by_pool.items()}
    return [
        {
            "poolId": offering.pool_id,
            "poolName": offering.pool.name,
            "ownerTenantId": offering.pool.owner_id,
            "tenantId": offering.tenant_id,
            "quota": [
                {"resource": row.resource, "max": row.max, "used": row.used, "mode": row.mode}
                for row in rows[offering.pool_id][offering.tenant_id]
            ],
        }
        for offering in offerings
    ]


def quota_rows(*, pool_id: str, tenant_ids: list[str]) -> dict[str, list[QuotaUsage]]:
    """Each tenant's quota rows in the pool, in resource order."""
    found: dict[str, list[QuotaUsage]] = {tenant: [] for tenant in tenant_ids}
    for row in QuotaUsage.objects.filter(pool_id=pool_id, tenant_id__in=tenant_ids).order_by("resource"):
        found[row.tenant_id].append(row)
    return found
